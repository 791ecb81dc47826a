"""Scheduling, plain Python (no torch): the scheduler (scheduler.py), its admission rules (admit_rules.py), batch-job
lines below online traffic (batch_bound.py), request priority's one order (order.py) and an urgent arrival's short
step (urgent_first.py), chunk building (chunks.py), multi-step bursts and their pacer (bursts.py), and what its queues
say about the load (sched_stats.py)."""

"""The KV cache's bookkeeping: the block manager and its prefix cache (block_manager.py), swap to the host pool
(swap.py), and the prefix cache's events: the sink interface (kv_event_types.py), the publisher (kv_events.py) and
vLLM's wire format (kv_event_wire.py)."""

"""The scheduler's one order: class first (engine.contract.PRIORITY_*: online requests ahead of batch-job
lines), then the client's request priority (``rank``, vLLM's convention: lower runs first, 0 by default;
each dialect's own scale is mapped onto it by its parser, e.g. MindIE's [1, 5] with default 5 as -4..0).
Within one key, first come first served. The waiting queue, the swapped queue's turn and the running list
all follow it: the running list's last entry, the preemption victim, is the least urgent, newest one.

No request starves: one that has waited AGING_S behind a more urgent head of its class goes to the front
(``promote_aged``, before each step's admission), so a steady flow of urgent requests delays it by at most that."""
from __future__ import annotations

from collections import deque

from mindie_service.engine.sequence import Sequence

AGING_S = 10.0  # the longest a request waits behind more urgent ones of its class before it is served first


def urgency(seq: Sequence) -> tuple[int, int]:
    """The sort key: smaller runs first, larger is preempted first."""
    return seq.priority, seq.rank


def promote_aged(waiting: deque[Sequence], now: float | None, aging_s: float = AGING_S) -> None:
    """Move the earliest request that has waited ``aging_s`` behind a more urgent head of its class to the
    front of ``waiting``. Nothing moves when ranks are equal (the queue is first come, first served then) or
    without a clock."""
    if now is None or not waiting:
        return
    head = waiting[0]
    aged = [q for q in waiting if q.priority == head.priority and q.rank > head.rank and now - q.arrival >= aging_s]
    if aged:
        old = min(aged, key=lambda q: q.arrival)
        waiting.remove(old)
        waiting.appendleft(old)

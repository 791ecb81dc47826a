"""The scheduler's one order: class first (engine.contract.PRIORITY_*: online requests ahead of batch-job
lines), then the client's request priority (``rank``, vLLM's convention: lower runs first, 0 by default;
each dialect's own scale is mapped onto it by its parser, e.g. MindIE's [1, 5] with default 5 as -4..0).
Within one key, first come first served. The waiting queue, the swapped queue's turn and the running list
all follow it: the running list's last entry, the preemption victim, is the least urgent, newest one."""
from __future__ import annotations

from mindie_service.engine.sequence import Sequence


def urgency(seq: Sequence) -> tuple[int, int]:
    """The sort key: smaller runs first, larger is preempted first."""
    return seq.priority, seq.rank

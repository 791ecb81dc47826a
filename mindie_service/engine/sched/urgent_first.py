"""A more urgent request's prompt goes first (engine.sched.order's rank, within one class): while one is
prefilling, or is the waiting head this step can admit, the prompt pieces of less urgent running requests wait
(their decodes go on), so its prefill has the step's token budget and the step is not a long prefill of theirs.
A request that has waited order.AGING_S since it arrived no longer yields (no starvation behind a flow of urgent
prompts). Equal ranks never yield: default traffic is scheduled as before. Plain Python (no torch)."""
from __future__ import annotations

from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.sched.admit_rules import room_for
from mindie_service.engine.sched.chunks import prefilling
from mindie_service.engine.sched.order import AGING_S, urgency
from mindie_service.engine.sequence import Sequence, SeqStatus


def urgent_key(cfg: EngineConfig, blocks: BlockManager, running: list[Sequence],
               head: Sequence | None) -> tuple[int, int] | None:
    """The most urgent (class, rank) whose prompt runs this step: a running prefill, or the waiting head when
    there is a slot and blocks to admit it now; None when nothing prefills."""
    keys = [urgency(s) for s in running if prefilling(s)]
    if (head is not None and head.status is SeqStatus.WAITING and len(running) < cfg.max_batch_size
            and room_for(cfg, blocks, head)):
        keys.append(urgency(head))
    return min(keys) if keys else None


def yields(seq: Sequence, key: tuple[int, int] | None, now: float | None, aging_s: float = AGING_S) -> bool:
    """Whether running ``seq``'s prompt piece waits this step for a more urgent one of its class (``key``)."""
    return (key is not None and seq.group is None and seq.priority == key[0] and seq.rank > key[1]
            and (now is None or now - seq.arrival < aging_s))

"""What the scheduler's queues say about the engine's load, read off the engine thread (a scrape, /v1/status).

The queues change under the reader while the engine steps; a copy is retried when one changed while it was
being read (a scrape never waits for a step)."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mindie_service.engine.contract import PRIORITY_ONLINE
from mindie_service.engine.sequence import Sequence
from mindie_service.sampling_params import is_base_adapter

_COPY_TRIES = 5


@dataclass(frozen=True)
class SchedulerStats:
    running: int
    waiting: int
    swapped: int
    num_preemptions: int
    batch_running: int  # of running / waiting: batch-job lines (below PRIORITY_ONLINE)
    batch_waiting: int
    running_adapters: tuple[str, ...]  # LoRA adapters of running requests (the inference gateway's picker)
    waiting_adapters: tuple[str, ...]  # ... of waiting and swapped ones


def _copy(seqs: Iterable[Sequence]) -> list[Sequence]:
    for _ in range(_COPY_TRIES):
        try:
            return list(seqs)
        except RuntimeError:  # changed while copied: read again
            continue
    return []


def _adapters(seqs: list[Sequence]) -> tuple[str, ...]:
    return tuple(sorted({s.params.adapter_id for s in seqs if not is_base_adapter(s.params.adapter_id)}))


def scheduler_stats(running: Iterable[Sequence], waiting: Iterable[Sequence], swapped: Iterable[Sequence],
                    num_preemptions: int) -> SchedulerStats:
    r, w, s = _copy(running), _copy(waiting), _copy(swapped)
    return SchedulerStats(running=len(r), waiting=len(w), swapped=len(s), num_preemptions=num_preemptions,
                          batch_running=sum(1 for q in r if q.priority != PRIORITY_ONLINE),
                          batch_waiting=sum(1 for q in w if q.priority != PRIORITY_ONLINE),
                          running_adapters=_adapters(r), waiting_adapters=_adapters(w + s))

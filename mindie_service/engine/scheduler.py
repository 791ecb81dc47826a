"""Continuous batching over the paged KV pool. Plain Python: the scheduler never imports torch.

Each step runs every running sequence for one decode token and admits waiting sequences for
prefill in the same forward pass (bounded by maxBatchSize, maxPrefillBatchSize, maxPrefillTokens
and free blocks). When blocks run out the newest running sequence is preempted: its blocks are
freed and it is recomputed later from its prompt plus the tokens it already produced."""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from mindie_service.engine.block_manager import BlockManager
from mindie_service.engine.config import EngineConfig
from mindie_service.engine.sequence import Sequence, SeqStatus

logger = logging.getLogger(__name__)


@dataclass
class SchedulerOutput:
    decodes: list[Sequence] = field(default_factory=list)  # one new token each
    prefills: list[Sequence] = field(default_factory=list)  # num_tokens - num_computed_tokens each
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.decodes and not self.prefills

    @property
    def seqs(self) -> list[Sequence]:
        return self.decodes + self.prefills


class AdapterSlots(Protocol):
    """Pins a sequence's LoRA adapter in a pool slot while it runs (see mindie_service.lora)."""

    def acquire(self, seq: Sequence) -> bool: ...  # False: no slot free now, the sequence waits

    def release(self, seq: Sequence, done: bool) -> None: ...  # preempted (done=False) or finished


class Scheduler:
    def __init__(self, cfg: EngineConfig, blocks: BlockManager, adapters: AdapterSlots | None = None) -> None:
        self.cfg, self.blocks, self.adapters = cfg, blocks, adapters
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Drop a sequence (finished or aborted) and free its blocks."""
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SeqStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free_seq(seq)
        seq.status = SeqStatus.FINISHED
        if self.adapters is not None:
            self.adapters.release(seq, done=True)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.blocks.free_seq(seq)
        if self.adapters is not None:
            self.adapters.release(seq, done=False)
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        logger.debug("preempted %s (%d tokens)", seq.request_id, seq.num_tokens)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        # Decode: oldest first; preempt from the newest end when the pool is dry.
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            while not self.blocks.can_append(seq):
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is seq:
                    break
            if seq.status is not SeqStatus.RUNNING:
                break
            self.blocks.append_slot(seq)
            out.decodes.append(seq)
            i += 1
        if out.preempted:
            return out
        # Prefill: first come, first served; the head of the queue is never skipped.
        budget = self.cfg.max_prefill_tokens
        while self.waiting:
            seq = self.waiting[0]
            if len(self.running) >= self.cfg.max_batch_size or len(out.prefills) >= self.cfg.max_prefill_batch_size:
                break
            if out.prefills and seq.num_tokens > budget:
                break
            # Distinct adapters are bounded by the LoRA pool's slots: the head waits for one to free up.
            if self.adapters is not None and not self.adapters.acquire(seq):
                break
            if not self.blocks.allocate(seq, use_prefix_cache=not seq.params.prompt_logprobs):
                if self.adapters is not None:
                    self.adapters.release(seq, done=False)
                break
            new_tokens = seq.num_tokens - seq.num_computed_tokens
            budget -= new_tokens
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            out.prefills.append(seq)
        if self.adapters is not None:  # one LoRA segment per adapter (stable: order kept within each)
            out.decodes.sort(key=_adapter_slot)
            out.prefills.sort(key=_adapter_slot)
        return out


def _adapter_slot(seq: Sequence) -> int:
    return seq.adapter_slot

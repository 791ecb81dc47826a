"""Continuous batching over the paged KV pool, with chunked prefill. Plain Python: the scheduler never
imports torch.

Each step every running request computes its next tokens in one forward pass: one token for a
request that is decoding, the next piece of its prompt for one that is still prefilling. Prompt
tokens are bounded per step by ``maxPrefillTokens`` (the step's token budget, vLLM's
max_num_batched_tokens; the running requests' decode tokens ride along), so a long prompt is
computed over several steps while the others keep streaming, instead of stalling them all for
its whole prefill. New requests are admitted first come, first served (the head of the queue is
never skipped) within maxBatchSize, maxPrefillBatchSize, free blocks and the LoRA pool's slots.
When blocks run out the newest running request is preempted: its blocks are freed and it is
recomputed later from its prompt plus the tokens it already produced.

``schedule()`` returns plain data (engine.step); ``update()`` applies a step's results."""
from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from typing import Protocol

from mindie_service.engine.block_manager import BlockManager
from mindie_service.engine.config import EngineConfig
from mindie_service.engine.sequence import Sequence, SeqStatus
from mindie_service.engine.step import ScheduledChunk, SchedulerOutput

logger = logging.getLogger(__name__)


class AdapterSlots(Protocol):
    """Pins a request's LoRA adapter in a pool slot while it runs (see mindie_service.lora)."""

    def acquire(self, request_id: str) -> int | None: ...  # its slot (0: base model); None: none free, wait

    def release(self, request_id: str, done: bool) -> None: ...  # preempted (done=False) or finished


class Scheduler:
    def __init__(self, cfg: EngineConfig, blocks: BlockManager, adapters: AdapterSlots | None = None) -> None:
        self.cfg, self.blocks, self.adapters = cfg, blocks, adapters
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.seqs: dict[str, Sequence] = {}
        self.num_preemptions = 0

    # ------------------------------------------------------------ queue
    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.seqs[seq.request_id] = seq
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def get(self, request_id: str) -> Sequence | None:
        return self.seqs.get(request_id)

    def finish(self, seq: Sequence, reason: str | None = None) -> None:
        """Drop a sequence (finished, or aborted with ``reason`` None) and free its blocks."""
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SeqStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free_seq(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        self.seqs.pop(seq.request_id, None)
        if self.adapters is not None:
            self.adapters.release(seq.request_id, done=True)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.blocks.free_seq(seq)
        if self.adapters is not None:
            self.adapters.release(seq.request_id, done=False)
        seq.adapter_slot = 0
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq.request_id)
        logger.debug("preempted %s (%d tokens)", seq.request_id, seq.num_tokens)

    # ------------------------------------------------------------ one step
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        decodes: list[Sequence] = []
        prefills: list[tuple[Sequence, int]] = []  # (sequence, tokens this step)
        budget = self.cfg.max_prefill_tokens
        # Running requests, oldest first: decodes need a slot for their next token (preempt from the
        # newest end when the pool is dry); unfinished prompts take their next piece of the budget.
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            if _prefilling(seq):  # its blocks were allocated at admission
                n = min(seq.num_tokens - seq.num_computed_tokens, budget)
                if n > 0 and len(prefills) < self.cfg.max_prefill_batch_size:
                    prefills.append((seq, n))
                    budget -= n
                i += 1
                continue
            while not self.blocks.can_append(seq):
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is seq:
                    break
            if seq.status is not SeqStatus.RUNNING:
                break
            self.blocks.append_slot(seq)
            decodes.append(seq)
            i += 1
        if not out.preempted:
            self._admit(prefills, budget)
        if self.adapters is not None:  # one LoRA segment per adapter (stable: order kept within each)
            decodes.sort(key=_adapter_slot)
            prefills.sort(key=lambda p: p[0].adapter_slot)
        out.chunks = [_chunk(s, 1) for s in decodes] + [_chunk(s, n) for s, n in prefills]
        out.num_decodes = len(decodes)
        return out

    def _admit(self, prefills: list[tuple[Sequence, int]], budget: int) -> None:
        """Admit waiting requests, first come first served, while the budget and the limits allow."""
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            if len(self.running) >= self.cfg.max_batch_size or len(prefills) >= self.cfg.max_prefill_batch_size:
                break
            # Distinct adapters are bounded by the LoRA pool's slots: the head waits for one to free up.
            if self.adapters is not None:
                slot = self.adapters.acquire(seq.request_id)
                if slot is None:
                    break
                seq.adapter_slot = slot
            if not self.blocks.allocate(seq, use_prefix_cache=not seq.params.prompt_logprobs):
                if self.adapters is not None:
                    self.adapters.release(seq.request_id, done=False)
                    seq.adapter_slot = 0
                break
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            budget -= n
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            prefills.append((seq, n))

    def update(self, out: SchedulerOutput, sampled: Mapping[str, int], finished: Mapping[str, str]) -> None:
        """Apply a step: each chunk's K/V is now computed (its full blocks enter the prefix cache), each
        sampled token is appended, and the requests in ``finished`` (request id -> reason) end.
        Chunks of requests aborted or failed during the step are skipped."""
        for c in out.chunks:
            seq = self.seqs.get(c.request_id)
            if seq is None or seq.status is not SeqStatus.RUNNING:
                continue
            seq.num_computed_tokens = c.end
            self.blocks.register_computed(seq)
            tid = sampled.get(c.request_id)
            if tid is not None:
                seq.output_token_ids.append(tid)
            reason = finished.get(c.request_id)
            if reason is not None:
                self.finish(seq, reason)


def _prefilling(seq: Sequence) -> bool:
    """More than the last token left to compute, or a prompt token (media placeholders, prompt logprobs)."""
    done = seq.num_computed_tokens
    return done < seq.num_tokens - 1 or done < seq.num_prompt_tokens


def _chunk(seq: Sequence, n: int) -> ScheduledChunk:
    start = seq.num_computed_tokens
    end = start + n
    tokens = (seq.token_at(start),) if n == 1 else tuple(seq.token_ids()[start:end])
    in_prompt = start < seq.num_prompt_tokens
    mm = seq.mm_inputs is not None and in_prompt
    return ScheduledChunk(
        request_id=seq.request_id, start=start, token_ids=tokens, block_table=tuple(seq.block_table),
        sample=end == seq.num_tokens, adapter_slot=seq.adapter_slot,
        prompt_logprobs=seq.params.prompt_logprobs and in_prompt and not seq.output_token_ids,
        mm_inputs=seq.mm_inputs if mm else None, prompt_token_ids=tuple(seq.prompt_token_ids) if mm else None)


def _adapter_slot(seq: Sequence) -> int:
    return seq.adapter_slot

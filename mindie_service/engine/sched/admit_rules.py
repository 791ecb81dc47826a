"""Admission rules of MindIE's schedule keys, apart from the scheduler's mechanics (plain Python):

- maxPreemptCount 0 (no preemption): how many blocks a request is admitted with, reserved for it;
- maxQueueDelayMicroseconds: how long new prompts wait for others to join their prefill batch;
- whether the pool holds a request's blocks now (an online request preempts batch lines until it does)."""
from __future__ import annotations

from collections.abc import Callable, Collection

from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.sequence import Sequence, SeqStatus


def reservation_blocks(cfg: EngineConfig, seq: Sequence, blocks_needed: Callable[[int], int], pool: int) -> int:
    """With maxPreemptCount 0, the blocks ``seq`` (or its beam search) is admitted with: its prompt plus its
    maximum output; a group's (a beam search's) width times that, plus the two fresh blocks a fork may take
    per member before the members it replaces are dropped (at most the ``pool``). 0 otherwise: no reservation."""
    if cfg.max_preempt_count > 0:
        return 0
    full = blocks_needed(seq.num_prompt_tokens + seq.max_output)
    if seq.group is None:
        return full
    return min(seq.group.width * (full + 2), pool)


def queue_delay(cfg: EngineConfig, waiting: Collection[Sequence], busy: bool, now: float | None) -> float:
    """Seconds the waiting prompts should still wait: with nothing running (``busy`` false) they wait, at
    most maxQueueDelayMicroseconds after the first of them arrived, for more to fill their prefill batch
    (maxPrefillBatchSize prompts or maxPrefillTokens tokens), then go. While anything runs, new prompts
    join the next step at once (continuous batching). ``now`` None: no clock, never wait."""
    delay = cfg.max_queue_delay_microseconds / 1e6
    if now is None or delay <= 0 or busy or not waiting or len(waiting) >= cfg.max_prefill_batch_size:
        return 0.0
    if sum(q.num_tokens for q in waiting) >= cfg.max_prefill_tokens:
        return 0.0
    return max(0.0, min(q.arrival for q in waiting) + delay - now)


def room_for(cfg: EngineConfig, blocks: BlockManager, seq: Sequence) -> bool:
    """Whether the pool holds ``seq``'s blocks now: a waiting request's exactly as the scheduler allocates them
    (prefix-cache hits cost nothing: preempting a batch line for blocks the request would not take only loses
    that line's work); a swapped one's, its blocks and its reservation."""
    reserve = reservation_blocks(cfg, seq, blocks.blocks_needed, blocks.num_blocks)
    if seq.status is SeqStatus.SWAPPED:
        return blocks.num_available_blocks >= max(blocks.blocks_needed(seq.num_tokens), reserve)
    return blocks.can_allocate(seq, not seq.params.prompt_logprobs, reserve)

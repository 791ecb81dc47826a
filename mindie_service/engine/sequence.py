"""A request's token state inside the engine (the scheduler and the block manager own it; the runner
sees only the plain ScheduledChunks of engine.step)."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from mindie_service.sampling_params import SamplingParams


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"  # preempted with its K/V copied to the host pool (engine.swap); resumes where it was
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_output: int  # min(max_tokens, maxIterTimes, maxSeqLen - prompt_len)
    seed: int
    cache_key: bytes = b""  # adapter identity + media hashes: folded into every prefix-cache block hash
    adapter_slot: int = 0  # LoRA pool slot (0 = base model)
    priority: int = 0  # engine.types.PRIORITY_*: online first, batch-job lines after (and preempted first)
    mm_inputs: Any = None
    output_token_ids: list[int] = field(default_factory=list)
    status: SeqStatus = SeqStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = 0  # of those, found in the prefix cache at admission
    num_registered_blocks: int = 0  # leading full blocks already entered in the prefix cache
    block_hashes: list[bytes] = field(default_factory=list)
    num_preemptions: int = 0
    arrival: float = 0.0  # when the scheduler queued it (its clock): maxQueueDelayMicroseconds counts from here
    host_blocks: list[int] = field(default_factory=list)  # while SWAPPED: host-pool blocks holding its K/V
    finish_reason: str | None = None
    aborted: bool = False
    session_id: str | None = None  # kept for continuation under this key when it finishes (engine.sessions)
    group: Any = None  # the engine.beam.BeamGroup this sequence is a beam of (None: not a beam)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_at(self, i: int) -> int:
        p = len(self.prompt_token_ids)
        return self.prompt_token_ids[i] if i < p else self.output_token_ids[i - p]

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

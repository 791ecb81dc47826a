"""Plain values passed between the frontend and the engine."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mindie_service.sampling_params import SamplingParams

FINISH_LENGTH = "length"
FINISH_EOS = "eos_token"
FINISH_STOP = "stop_sequence"
# Request priorities: online traffic first; batch-job lines fill what it leaves and are preempted for it.
PRIORITY_ONLINE = 0
PRIORITY_BATCH = 1


@dataclass(frozen=True)
class EngineRequest:
    """What the input processor hands the engine: tokenized, truncated, within the length rule, its
    token ids in the vocabulary, its adapter name known. The engine trusts it (it only binds the
    adapter, which may have been unloaded since)."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    # Multimodal inputs prepared by the model's processor (placeholder-expanded ids are already
    # in prompt_token_ids); None for text-only requests.
    mm_inputs: Any = None
    # Content hashes of every media item, folded into prefix-cache keys.
    mm_hashes: tuple[str, ...] = ()
    priority: int = PRIORITY_ONLINE
    # The client's session key (/api/* request_id): the engine keeps the finished sequence under it.
    session_id: str | None = None
    continued: bool = False  # the prompt is that session's tokens (a continuation)


@dataclass(frozen=True)
class TokenInfo:
    id: int
    logprob: float | None
    text: str
    special: bool
    top: tuple["TokenInfo", ...] = ()


@dataclass
class TokenEvent:
    """One generated token of one request, as the facade yields it."""

    request_id: str
    token: TokenInfo
    text_delta: str  # new text (stop text trimmed; "" while a UTF-8 character is incomplete)
    index: int  # 0-based position in the output
    finish_reason: str | None = None
    # Set on the first event: the prompt's tokens (with logprobs when asked) and the seed used.
    prompt_tokens: list[TokenInfo] | None = None
    num_prompt_tokens: int = 0
    seed: int | None = None
    # Set on the last event: the whole generated text (stop text trimmed).
    full_text: str | None = None


@dataclass
class FailedEvent:
    """The engine failed this request alone (the others go on): the facade raises GenerationError."""

    request_id: str
    message: str


@dataclass
class EngineStats:
    running: int
    waiting: int
    swapped: int
    total_blocks: int
    free_blocks: int
    cache_usage: float
    prefix_cache_hit_rate: float
    num_preemptions: int
    # Kept sessions (/api/* continuation by request_id): held now, continuations served, evictions.
    sessions_held: int = 0
    session_hits: int = 0
    session_evictions: int = 0
    session_pinned_blocks: int = 0
    # Of running / waiting: batch-job lines (PRIORITY_BATCH), counted apart for /v1/status and the metrics.
    batch_running: int = 0
    batch_waiting: int = 0
    # Speculative decoding (engine.speculative), totals since start: verify rows that carried drafts, the
    # draft tokens they carried, those accepted; and the tokens a verify row yields on average (1 + accepted).
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_mean_accepted_length: float = 0.0

"""The engine contract (torch-free): the plain values passed between the serving core and the engine --
EngineRequest in, TokenEvent out, the finish reasons, priorities, stats, and the facts an engine client gives
the input processor (InputFacts). SamplingParams is re-exported from mindie_service.sampling_params."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Protocol

from mindie_service.errors import ValidationError
from mindie_service.sampling_params import SamplingParams

__all__ = ["EngineRequest", "EngineStats", "FailedEvent", "FINISH_EOS", "FINISH_LENGTH", "FINISH_STOP",
           "InputFacts", "PoolRequest", "PoolResult", "PRIORITY_BATCH", "PRIORITY_ONLINE", "SamplingParams",
           "SessionTokens", "StepTokenCounts", "TokenEvent", "TokenInfo", "check_task"]

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
    rank: int = 0  # the client's request priority within its class, vLLM's convention: lower first, 0 default
    # The client's session key (/api/* request_id): the engine keeps the finished sequence under it.
    session_id: str | None = None
    continued: bool = False  # the prompt is that session's tokens (a continuation)


# What a model serves (EngineClient.tasks; models/pooling_spec.py decides it from the checkpoint and the config).
SERVED_BY = {"embed": "a decoder LM (last-token pooling) or an embedding checkpoint (LlamaModel, sentence-transformers)",
             "score": "a sequence-classification checkpoint with one label (LlamaForSequenceClassification, "
                      "a cross-encoder)",
             "generate": "a causal LM checkpoint (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)"}
_WHAT = {"embed": "embeddings", "score": "scores (rerank, score)", "generate": "text generation"}


def check_task(tasks: frozenset[str], task: str, model: str) -> None:
    """ValidationError (OpenAI's 400) naming which checkpoint kinds serve ``task`` when ``model`` does not."""
    if task not in tasks:
        raise ValidationError(f"model {model} does not serve {_WHAT[task]}: it serves {', '.join(sorted(tasks))}; "
                              f"{_WHAT[task]} {'is' if task == 'generate' else 'are'} served by {SERVED_BY[task]}")


@dataclass(frozen=True)
class PoolRequest:
    """A prefill-only request (engine.pooling): one forward per input, no KV kept, no decode slot. ``task``:
    "embed" (a pooled vector per input, truncated to ``dimensions`` and renormalised where asked) or "score" (the
    score head's outputs at each input's last token; a pair is one input, joined by the tokenizer)."""

    request_id: str
    inputs: tuple[tuple[int, ...], ...]
    task: str
    dimensions: int | None = None


@dataclass
class PoolResult:
    request_id: str
    vectors: list[list[float]]  # one per input, in order
    num_prompt_tokens: int


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
    num_cached_tokens: int = 0  # of the prompt's, found in the prefix cache (or a kept session) at admission
    seed: int | None = None
    # Set on the last event: the whole generated text (stop text trimmed; the answer alone when split).
    full_text: str | None = None
    # The reasoning split (engine.output.reasoning), where the request asked for it: this token's thinking text
    # (text_delta is then the answer's); on the last event the whole thinking and its token count.
    reasoning_delta: str = ""
    full_reasoning: str | None = None
    reasoning_tokens: int = 0
    # Set on the first event, on the engine's clock (time.monotonic): when the scheduler queued the request and
    # when it first scheduled it (vLLM's queued_ts / scheduled_ts: queue and prefill times); None where unknown.
    queued_at: float | None = None
    scheduled_at: float | None = None


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
    # Speculative decoding (engine.spec.speculator), totals since start: verify rows that carried drafts, the
    # draft tokens they carried, those accepted; and the tokens a verify row yields on average (1 + accepted).
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_mean_accepted_length: float = 0.0
    # What an inference gateway's endpoint picker reads (fleet.gateway_view): the adapters of running and of
    # waiting (or swapped) requests, the host pool for swapped-out K/V, the KV-event publisher's batches, and the
    # cache's shape (fixed for an engine's life).
    running_adapters: tuple[str, ...] = ()
    waiting_adapters: tuple[str, ...] = ()
    host_blocks: int = 0
    kv_events_published: int = 0
    kv_events_dropped: int = 0
    block_size: int = 0
    max_loras: int = 0
    kv_cache_dtype: str = "auto"
    prefix_caching: bool = False
    iteration_tokens: StepTokenCounts = field(default_factory=lambda: StepTokenCounts())  # (the async facade's)
    kv_pool_bytes: int = 0  # the KV pool's tensors as allocated (residency's measured memory reads it)


# vLLM's iteration_tokens buckets (vllm/v1/metrics/buckets.py ITERATION_TOKENS_BUCKETS): upper bounds of the
# tokens one engine step carried.
STEP_TOKEN_BOUNDS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@dataclass(frozen=True)
class StepTokenCounts:
    """Engine steps by the tokens they carried, as vLLM counts them (each output token, plus a whole prompt in
    the step its first token came out): ``counts[i]`` steps within ``STEP_TOKEN_BOUNDS[i]`` and above the bound
    before (one more for the rest), ``total`` the tokens of them all. Summed over model instances with ``+``."""

    counts: tuple[int, ...] = (0,) * (len(STEP_TOKEN_BOUNDS) + 1)
    total: int = 0

    def __add__(self, other: object) -> StepTokenCounts:
        if other == 0:  # sum()'s start
            return self
        assert isinstance(other, StepTokenCounts)
        return StepTokenCounts(tuple(a + b for a, b in zip(self.counts, other.counts)), self.total + other.total)

    __radd__ = __add__


class SessionTokens(Protocol):
    """An engine's kept sessions, as input processing reads them (engine.sessions.session_store.SessionStore)."""

    def tokens(self, session_id: str) -> tuple[int, ...] | None: ...  # None: no finished session by that key


@dataclass
class InputFacts:
    """What an engine client tells the serving core so it can build the engine's input processor
    (inputs.builder.build_processor): tokenizer, length limits, vocabulary, adapters, media encoder, sessions.
    The engine never builds the processor itself. ``chat_prefixes``: model.json prompt prefixes for a
    checkpoint without a chat template (the catalog sets them before the engine serves)."""

    tokenize: Callable[[str], list[int]]
    vocab_size: int
    max_input_len: int  # ModelDeployConfig's effective maxInputTokenLen
    pool_tokens: int  # tokens the KV pool holds
    truncation: bool
    adapter_names: Callable[[], Collection[str]] = frozenset
    tokenizer: Any = None  # the Hugging Face tokenizer (chat template, text bound); None: the StandardMock's bytes
    mm_encoder: Any = None  # inputs.types.MediaEncoder of a multimodal checkpoint
    video_frames: int = 8  # frames sampled per video
    sessions: SessionTokens | None = None
    chat_prefixes: Any = None
    grammars: Any = None  # structured.compiler.GrammarCompiler of the engine's tokenizer; None: no structured output

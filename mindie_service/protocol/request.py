"""The API-neutral generation request every dialect parses into, and the result every encoder folds from.

The dialects' parsers (``mindie``, ``tgi``, ``openai``) read their fields through the rule table
(mindie_service.params.table) into one ``GenerationRequest``: the prompt (text, MindIE's list of parts with
media references, chat messages or token ids), the SamplingParams and the response options. It does not
tokenize: the input processor (mindie_service.inputs) turns the request into the engine's.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mindie_service.engine.contract import TokenEvent, TokenInfo
from mindie_service.inputs.types import PartsPrompt, TextPrompt
from mindie_service.params.table import MAX_BEST_OF, MAX_STOP_STRINGS, MAX_TOP_LOGPROBS
from mindie_service.sampling_params import SamplingParams
from multimodal import MediaPolicy

MAX_TOP_N_TOKENS = MAX_TOP_LOGPROBS


@dataclass(frozen=True)
class ProtocolLimits:
    """What parsing needs to know about the deployment (lengths, adapters and media kinds are the
    input processor's)."""

    vocab_size: int  # top_k at or above it means the whole vocabulary
    media_policy: MediaPolicy | None = None  # caps for list-form inputs (how many media items)
    max_best_of: int = MAX_BEST_OF
    max_stop_sequences: int = MAX_STOP_STRINGS
    max_top_n_tokens: int = MAX_TOP_N_TOKENS


@dataclass(frozen=True)
class GenerationRequest:
    """One validated generation call, API-neutral, not yet tokenized."""

    prompt: TextPrompt | PartsPrompt
    params: SamplingParams
    truncate: int | None = None  # keep the last N prompt tokens (the input processor applies it)
    stream: bool = False
    details: bool = False  # return details
    decoder_input_details: bool = False  # return the prompt tokens (prefill) in details
    return_full_text: bool = False
    best_of: int = 1
    top_n_tokens: int = 0
    sampling: bool = False  # False: greedy (TGI reports seed null then)
    rank: int = 0  # the request priority, lower first (params.priority maps each dialect's field onto it)

    @property
    def inputs(self) -> str:
        """The prompt's text (list inputs: their text parts joined)."""
        return self.prompt.text

    @property
    def prefix(self) -> str:
        return self.inputs if self.return_full_text else ""


@dataclass
class GenerationResult:
    """Everything one engine request produced, folded from its TokenEvents."""

    tokens: list[TokenInfo] = field(default_factory=list)
    prompt_tokens: list[TokenInfo] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # of the prompt's, served from the prefix cache
    seed: int | None = None
    finish_reason: str | None = None
    deltas: list[str] = field(default_factory=list)
    full_text: str | None = None
    # The reasoning split (engine.output.reasoning): the thinking apart from the answer, where the request asked
    # for it (chat, Messages) and the model thinks; ``full_reasoning`` None: no split.
    reasoning_deltas: list[str] = field(default_factory=list)
    full_reasoning: str | None = None
    reasoning_tokens: int = 0

    def add(self, ev: TokenEvent) -> None:
        if not self.tokens:
            self.prompt_tokens = list(ev.prompt_tokens or [])
            self.num_prompt_tokens = ev.num_prompt_tokens or len(self.prompt_tokens)
            self.num_cached_tokens = ev.num_cached_tokens
            self.seed = ev.seed
        self.tokens.append(ev.token)
        self.deltas.append(ev.text_delta)
        self.reasoning_deltas.append(ev.reasoning_delta)
        if ev.finish_reason is not None:
            self.finish_reason = ev.finish_reason
            self.full_text = ev.full_text
            self.full_reasoning, self.reasoning_tokens = ev.full_reasoning, ev.reasoning_tokens

    @property
    def text(self) -> str:
        return self.full_text if self.full_text is not None else "".join(self.deltas)

    @property
    def reasoning(self) -> str:
        """The thinking text ("" without a split)."""
        return self.full_reasoning if self.full_reasoning is not None else "".join(self.reasoning_deltas)

    @property
    def mean_logprob(self) -> float:
        lps = [t.logprob for t in self.tokens if t.logprob is not None]
        return sum(lps) / len(lps) if lps else float("-inf")


def select_best(results: list[GenerationResult]) -> tuple[GenerationResult, list[GenerationResult]]:
    """TGI's best_of: the sequence with the highest mean token logprob; the others come back too."""
    i = max(range(len(results)), key=lambda k: results[k].mean_logprob)
    return results[i], results[:i] + results[i + 1:]

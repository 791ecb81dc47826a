"""The generation request both API families parse into, and the result both encode from.

``parse_generation`` turns a validated ``inputs`` + ``parameters`` pair into one API-neutral
``GenerationRequest``: the prompt (text, or MindIE's list of parts with media references), the
SamplingParams and the response options. It does not tokenize: the input processor
(mindie_service.inputs) turns the request into the engine's. The rules of `/` (MindIE) and
`/generate*` (TGI 1.1) differ only where the two contracts do; the table lives here, the range
vocabulary in ``validation``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from mindie_service.engine.contract import TokenEvent, TokenInfo
from mindie_service.errors import ValidationError, check
from mindie_service.inputs.types import PartsPrompt, TextPrompt
from mindie_service.protocol.validation import (
    Range,
    get_bool,
    get_float,
    get_int,
    get_str,
    get_str_list,
    require_object,
)
from mindie_service.sampling_params import (
    BASE_ADAPTER,
    INT32_MAX,
    MAX_STOP_LEN,
    MAX_STOP_STRINGS,
    MAX_TOP_LOGPROBS,
    UINT64_MAX,
    SamplingParams,
    is_base_adapter,
)
from multimodal import MediaItem, MediaPolicy, TextPart, parse_parts

Dialect = Literal["mindie", "tgi"]

MAX_BEST_OF = 4
MAX_TOP_N_TOKENS = MAX_TOP_LOGPROBS
ADAPTER_RE = re.compile(r"^[a-zA-Z0-9_./-]{1,256}$")

# Ranges where the two contracts differ: MindIE's `/` table vs TGI 1.1's GenerateParameters.
_TEMPERATURE = {"mindie": Range(1e-6), "tgi": Range(0.0)}
_TOP_P = {"mindie": Range(1e-6, 1.0, hi_open=True), "tgi": Range(0.0, 1.0)}
_TYPICAL_P = {"mindie": Range(0.0, 1.0), "tgi": Range(0.0, 1.0)}
_POSITIVE_INT32 = Range(0, INT32_MAX)
_SEED = Range(0, UINT64_MAX)


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

    @property
    def inputs(self) -> str:
        """The prompt's text (list inputs: their text parts joined)."""
        return self.prompt.text

    @property
    def prefix(self) -> str:
        return self.inputs if self.return_full_text else ""


def _prompt(body: dict[str, Any], limits: ProtocolLimits) -> TextPrompt | PartsPrompt:
    """``inputs`` -> a prompt. A string, or MindIE's list of text/image_url/video_url/audio_url parts;
    a list with media stays parts (fetched and decoded later, off the parser), a list of text parts
    alone is their text joined."""
    v = body.get("inputs")
    if v is None:
        raise ValidationError("Parameter inputs is required, got none")
    if isinstance(v, list):
        parts = parse_parts(v, limits.media_policy or MediaPolicy())
        text = "\n".join(p.text for p in parts if isinstance(p, TextPart))
        if not any(isinstance(p, MediaItem) for p in parts):
            check(len(text) > 0, "inputs", "a list holding at least one non-empty text part", v)
            return TextPrompt(text)
        return PartsPrompt(tuple(parts), text)
    check(isinstance(v, str), "inputs", "a string or a list of parts", v)
    check(len(v) > 0, "inputs", "a non-empty string", v)
    return TextPrompt(v)


def parse_generation(body: dict[str, Any], *, dialect: Dialect, stream: bool,
                     limits: ProtocolLimits) -> GenerationRequest:
    """Validate ``body`` (``inputs`` + ``parameters``); raise ValidationError on bad input."""
    prompt = _prompt(body, limits)
    p = require_object(body.get("parameters"), "parameters")

    details = bool(get_bool(p, "details", False))
    decoder_input_details = bool(get_bool(p, "decoder_input_details", False))
    check(not (stream and decoder_input_details), "decoder_input_details", "false when stream is true", True)
    do_sample = get_bool(p, "do_sample", None)
    max_new_tokens = get_int(p, "max_new_tokens", _POSITIVE_INT32, 20)
    repetition_penalty = get_float(p, "repetition_penalty", Range(0.0), 1.0)
    frequency_penalty = get_float(p, "frequency_penalty", Range(-2.0, 2.0, lo_open=False), 0.0)
    return_full_text = bool(get_bool(p, "return_full_text", False))
    seed = get_int(p, "seed", _SEED, None)
    temperature = get_float(p, "temperature", _TEMPERATURE[dialect], None)
    top_k = get_int(p, "top_k", _POSITIVE_INT32, None)
    top_p = get_float(p, "top_p", _TOP_P[dialect], None)
    truncate = get_int(p, "truncate", _POSITIVE_INT32, None)
    typical_p = get_float(p, "typical_p", _TYPICAL_P[dialect], None)
    # MindIE documents watermark as unsupported; TGI's green-list watermark is not implemented either.
    check(not get_bool(p, "watermark", False), "watermark", "false (watermarking is not supported)", True)
    stop = get_str_list(p, "stop", limits.max_stop_sequences, MAX_STOP_LEN)
    best_of = get_int(p, "best_of", Range(0, limits.max_best_of), 1)
    top_n_tokens = get_int(p, "top_n_tokens", Range(0, limits.max_top_n_tokens, lo_open=False), 0)
    if p.get("grammar") is not None:
        raise ValidationError(f"Parameter grammar must be null (grammar-constrained decoding is not supported), "
                              f"got {p['grammar']!r}")
    adapter = get_str(p, "adapter_id", BASE_ADAPTER)
    check(ADAPTER_RE.match(adapter) is not None, "adapter_id", "a string matching ^[a-zA-Z0-9_./-]{1,256}$", adapter)

    # TGI's rule (MindIE: "decided by the other parameters" when do_sample is absent): sample when asked
    # or when any warper is set to a non-neutral value.
    warpers = ((temperature is not None and temperature != 1.0) or (top_k is not None)
               or (top_p is not None and top_p < 1.0) or (typical_p is not None and typical_p < 1.0))
    sampling = bool(do_sample) or warpers
    if best_of > 1:
        check(not stream, "best_of", "1 when stream is true", best_of)
        check(seed is None, "best_of", "1 when a seed is given", best_of)
        check(sampling, "best_of", "1 unless sampling (do_sample or a temperature/top_k/top_p/typical_p)", best_of)

    if top_k is not None and top_k >= limits.vocab_size:
        top_k = None  # MindIE: top_k >= vocab size means the whole vocabulary
    params = SamplingParams(
        max_tokens=max_new_tokens,
        temperature=(temperature if temperature is not None else 1.0) if sampling else 0.0,
        top_k=(top_k or 0) if sampling else 0,
        top_p=(top_p if top_p is not None else 1.0) if sampling else 1.0,
        typical_p=(typical_p if typical_p is not None else 1.0) if sampling else 1.0,
        repetition_penalty=repetition_penalty,
        frequency_penalty=frequency_penalty,
        seed=seed,
        stop=stop,
        logprobs=top_n_tokens or None,
        prompt_logprobs=decoder_input_details or (dialect == "mindie" and details),
        adapter_id=None if is_base_adapter(adapter) else adapter,
    )
    return GenerationRequest(
        prompt=prompt, params=params, truncate=truncate, stream=stream,
        details=details or decoder_input_details, decoder_input_details=decoder_input_details,
        return_full_text=return_full_text, best_of=best_of, top_n_tokens=top_n_tokens, sampling=sampling,
    )


@dataclass
class GenerationResult:
    """Everything one engine request produced, folded from its TokenEvents."""

    tokens: list[TokenInfo] = field(default_factory=list)
    prompt_tokens: list[TokenInfo] = field(default_factory=list)
    num_prompt_tokens: int = 0
    seed: int | None = None
    finish_reason: str | None = None
    deltas: list[str] = field(default_factory=list)
    full_text: str | None = None

    def add(self, ev: TokenEvent) -> None:
        if not self.tokens:
            self.prompt_tokens = list(ev.prompt_tokens or [])
            self.num_prompt_tokens = ev.num_prompt_tokens or len(self.prompt_tokens)
            self.seed = ev.seed
        self.tokens.append(ev.token)
        self.deltas.append(ev.text_delta)
        if ev.finish_reason is not None:
            self.finish_reason = ev.finish_reason
            self.full_text = ev.full_text

    @property
    def text(self) -> str:
        return self.full_text if self.full_text is not None else "".join(self.deltas)

    @property
    def mean_logprob(self) -> float:
        lps = [t.logprob for t in self.tokens if t.logprob is not None]
        return sum(lps) / len(lps) if lps else float("-inf")


def select_best(results: list[GenerationResult]) -> tuple[GenerationResult, list[GenerationResult]]:
    """TGI's best_of: the sequence with the highest mean token logprob; the others come back too."""
    i = max(range(len(results)), key=lambda k: results[k].mean_logprob)
    return results[i], results[:i] + results[i + 1:]

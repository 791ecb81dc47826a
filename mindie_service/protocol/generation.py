"""The generation request both API families parse into, and the result both encode from.

``parse_generation`` turns a validated ``inputs`` + ``parameters`` pair into one
``GenerationRequest`` (prompt ids after tokenization and truncation, SamplingParams, response
options). The rules of `/` (MindIE) and `/generate*` (TGI 1.1) differ only where the two
contracts do; the table lives here, the range vocabulary in ``validation``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Literal

from mindie_service.engine.types import TokenEvent, TokenInfo
from multimodal import MediaItem, MediaPolicy, TextPart, parse_parts
from mindie_service.errors import ValidationError, check
from mindie_service.protocol.validation import (
    INT32_MAX,
    UINT64_MAX,
    Range,
    fit_prompt,
    get_bool,
    get_float,
    get_int,
    get_str,
    get_str_list,
    require_object,
)
from mindie_service.sampling_params import MAX_STOP_LEN, MAX_STOP_STRINGS, MAX_TOP_LOGPROBS, SamplingParams

Dialect = Literal["mindie", "tgi"]

MAX_BEST_OF = 4
MAX_TOP_N_TOKENS = MAX_TOP_LOGPROBS
ADAPTER_RE = re.compile(r"^[a-zA-Z0-9_./-]{1,256}$")
BASE_ADAPTER = "None"

# Ranges where the two contracts differ: MindIE's `/` table vs TGI 1.1's GenerateParameters.
_TEMPERATURE = {"mindie": Range(1e-6), "tgi": Range(0.0)}
_TOP_P = {"mindie": Range(1e-6, 1.0, hi_open=True), "tgi": Range(0.0, 1.0)}
_TYPICAL_P = {"mindie": Range(0.0, 1.0), "tgi": Range(0.0, 1.0)}
_POSITIVE_INT32 = Range(0, INT32_MAX)
_SEED = Range(0, UINT64_MAX)


@dataclass(frozen=True)
class ProtocolLimits:
    """What validation needs to know about the deployment (from config and the model)."""

    vocab_size: int
    max_input_len: int  # effective min(maxInputTokenLen, maxSeqLen - 1)
    truncation: bool  # ModelDeployConfig.truncation: cut long inputs instead of refusing them
    adapters: Collection[str] = ()  # known LoRA adapter names besides the base model
    modalities: Collection[str] = ()  # media kinds the model takes ("image", "audio"); video = images
    media_policy: MediaPolicy | None = None  # allow-lists and caps for list-form inputs
    max_best_of: int = MAX_BEST_OF
    max_stop_sequences: int = MAX_STOP_STRINGS
    max_top_n_tokens: int = MAX_TOP_N_TOKENS


@dataclass
class GenerationRequest:
    """One validated generation call, API-neutral."""

    inputs: str
    prompt_token_ids: list[int]
    params: SamplingParams
    stream: bool = False
    details: bool = False  # return details
    decoder_input_details: bool = False  # return the prompt tokens (prefill) in details
    return_full_text: bool = False
    best_of: int = 1
    top_n_tokens: int = 0
    sampling: bool = False  # False: greedy (TGI reports seed null then)
    parts: list[Any] | None = None  # list-form inputs with media, loaded by the server before generation
    mm_inputs: Any = None  # set once the media are loaded and the processor built the prompt
    mm_hashes: tuple[str, ...] = ()

    @property
    def prefix(self) -> str:
        return self.inputs if self.return_full_text else ""


def _inputs(body: dict[str, Any], limits: ProtocolLimits) -> tuple[str, list[Any] | None]:
    """``inputs`` -> (text, media parts). A string, or MindIE's list of text/image_url/video_url/
    audio_url parts; a list with media comes back as parts (fetched and decoded later, off the
    parser), the text being its text parts joined (what return_full_text prepends)."""
    v = body.get("inputs")
    if v is None:
        raise ValidationError("Parameter inputs is required, got none")
    if isinstance(v, list):
        parts = parse_parts(v, limits.media_policy or MediaPolicy())
        text = "\n".join(p.text for p in parts if isinstance(p, TextPart))
        media = [p for p in parts if isinstance(p, MediaItem)]
        if not media:
            check(len(text) > 0, "inputs", "a list holding at least one non-empty text part", v)
            return text, None
        for m in media:
            wanted = "image" if m.kind == "video" else m.kind
            if wanted not in limits.modalities:
                takes = ", ".join(sorted(limits.modalities)) or "text only"
                raise ValidationError(f"Parameter inputs[{m.index}] must be a part this model accepts ({takes}); "
                                      f"it takes no {m.kind} input, got {m.kind}_url")
        return text, parts
    check(isinstance(v, str), "inputs", "a string or a list of parts", v)
    check(len(v) > 0, "inputs", "a non-empty string", v)
    return v, None


def parse_generation(body: dict[str, Any], *, dialect: Dialect, stream: bool, limits: ProtocolLimits,
                     tokenize: Callable[[str], list[int]]) -> GenerationRequest:
    """Validate ``body`` (``inputs`` + ``parameters``) and tokenize; raise ValidationError on bad input."""
    inputs, parts = _inputs(body, limits)
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
    watermark = bool(get_bool(p, "watermark", False))
    stop = get_str_list(p, "stop", limits.max_stop_sequences, MAX_STOP_LEN)
    best_of = get_int(p, "best_of", Range(0, limits.max_best_of), 1)
    top_n_tokens = get_int(p, "top_n_tokens", Range(0, limits.max_top_n_tokens, lo_open=False), 0)
    if p.get("grammar") is not None:
        raise ValidationError(f"Parameter grammar must be null (grammar-constrained decoding is not supported), "
                              f"got {p['grammar']!r}")
    adapter = get_str(p, "adapter_id", BASE_ADAPTER)
    check(ADAPTER_RE.match(adapter) is not None, "adapter_id", "a string matching ^[a-zA-Z0-9_./-]{1,256}$", adapter)
    if adapter != BASE_ADAPTER and adapter not in limits.adapters:
        raise ValidationError(f"Parameter adapter_id must name a loaded LoRA adapter or \"None\", got {adapter!r}")

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
    try:
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
            adapter_id=None if adapter == BASE_ADAPTER else adapter,
            watermark=watermark,
        )
    except ValidationError:
        raise
    except ValueError as e:  # pragma: no cover - SamplingParams raises ValidationError already
        raise ValidationError(str(e)) from None

    if parts is not None:
        # The prompt is built by the model's processor once the media are loaded (server side).
        check(truncate is None, "truncate", "absent for inputs holding media (it would cut placeholders)", truncate)
        ids: list[int] = []
    else:
        ids = prompt_ids(inputs, tokenize, truncate, limits)
    return GenerationRequest(
        inputs=inputs, prompt_token_ids=ids, params=params, stream=stream, parts=parts,
        details=details or decoder_input_details, decoder_input_details=decoder_input_details,
        return_full_text=return_full_text, best_of=best_of, top_n_tokens=top_n_tokens, sampling=sampling,
    )


def prompt_ids(inputs: str, tokenize: Callable[[str], list[int]], truncate: int | None,
               limits: ProtocolLimits) -> list[int]:
    """Tokenize, apply ``truncate`` (keep the last N tokens), then the input-length limit."""
    ids = fit_prompt(list(tokenize(inputs)), truncate, limits.max_input_len, limits.truncation)
    check(len(ids) > 0, "inputs", "at least one token after tokenization", inputs)
    return ids


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

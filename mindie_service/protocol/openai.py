"""POST /v1/completions and /v1/chat/completions: OpenAI's request bodies -> an ``OpenAIRequest``.

Ranges and defaults are OpenAI's (temperature in [0, 2], 0 = greedy; top_p in (0, 1]; max_tokens 16 on
completions, up to the caps on chat). ``openAiSupport: "vllm"`` also takes vLLM's extra fields. A field we
cannot honour (tools, suffix, min_tokens...) is refused by name rather than ignored. The model
picks its engine (``peek_model``) before the rest is parsed with that model's request defaults.
"""
from __future__ import annotations

import base64
import binascii
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from mindie_service.errors import ValidationError, check
from mindie_service.inputs.types import ChatMessage, ChatPrompt, Prompt, TextPrompt, TokensPrompt
from mindie_service.protocol.generation import GenerationRequest, ProtocolLimits
from mindie_service.protocol.validation import Range, get_bool, get_float, get_int, get_str, get_str_list
from mindie_service.sampling_params import INT32_MAX, MAX_STOP_LEN, MAX_STOP_STRINGS, MAX_TOP_LOGPROBS, UINT64_MAX
from mindie_service.sampling_params import MAX_LOGIT_BIAS, SamplingParams
from multimodal import MediaItem, MediaPolicy

Kind = Literal["completion", "chat"]
Support = Literal["openai", "vllm"]

MAX_N = 16  # choices per prompt
MAX_CHOICES = 64  # prompts x n
MAX_PROMPTS = 64
MAX_MESSAGES = 512
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default on /v1/completions
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's cap on completions' logprobs (vLLM's too)
AUDIO_FORMATS = {"wav": "audio/wav", "mp3": "audio/mpeg", "flac": "audio/flac", "ogg": "audio/ogg"}

_COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "presence_penalty",
           "frequency_penalty", "logit_bias", "stream", "stream_options", "user", "logprobs"}
_FIELDS: dict[str, frozenset[str]] = {
    "completion": frozenset(_COMMON | {"prompt", "echo", "suffix", "best_of"}),
    "chat": frozenset(_COMMON | {"messages", "max_completion_tokens", "top_logprobs", "parallel_tool_calls"}),
}
VLLM_FIELDS = frozenset({"top_k", "repetition_penalty", "min_tokens", "ignore_eos"})
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


@dataclass(frozen=True)
class RequestDefaults:
    """A model's request defaults (its model.json ``parameters``); None: OpenAI's."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None  # token_limit


@dataclass(frozen=True)
class OpenAIRequest(GenerationRequest):
    """One OpenAI call: ``prompts`` (completions may hold several), ``best_of`` = n choices per prompt."""

    kind: Kind = "completion"
    model: str = ""
    prompts: tuple[Prompt, ...] = ()
    echo: bool = False
    logprobs: int | None = None  # top alternatives per token (0: the chosen token only); None: no logprobs
    include_usage: bool = False
    request_id: str = ""  # the response's id is derived from it
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def n(self) -> int:
        return self.best_of


def peek_model(body: dict[str, Any]) -> str:
    """The ``model`` field (required): which catalog model or adapter serves the request."""
    v = body.get("model")
    check(isinstance(v, str) and 0 < len(v) <= 256, "model", "a non-empty string naming a model of /v1/models", v)
    return v


def _refuse(body: dict[str, Any], name: str, neutral: Any, why: str) -> None:
    v = body.get(name)
    if v is not None and v != neutral:
        raise ValidationError(f"Parameter {name} must be absent or {neutral!r} ({why}), got {v!r}")


def _check_fields(body: dict[str, Any], kind: Kind, support: Support) -> None:
    allowed = _FIELDS[kind] | (VLLM_FIELDS if support == "vllm" else frozenset())
    unknown = sorted(k for k in body if k not in allowed)
    if unknown:
        extra = [k for k in unknown if k in VLLM_FIELDS]
        hint = (" (vLLM's extra fields need ServerConfig.openAiSupport = \"vllm\")" if extra
                else f" (this route takes {', '.join(sorted(allowed))})")
        raise ValidationError(f"Parameter {unknown[0]} is not supported on /v1/{'chat/' if kind == 'chat' else ''}"
                              f"completions{hint}, got {body[unknown[0]]!r}")


def _completion_prompts(body: dict[str, Any], vocab_size: int) -> tuple[Prompt, ...]:
    v = body.get("prompt")
    check(v is not None, "prompt", "a string, a list of strings, token ids or a list of token-id lists", v)
    if isinstance(v, str):
        items: list[Any] = [v]
    elif isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) for t in v):
        items = [v]
    else:
        check(isinstance(v, list) and 0 < len(v) <= MAX_PROMPTS, "prompt",
              f"a string or a non-empty list of at most {MAX_PROMPTS} prompts",
              v if not isinstance(v, list) else len(v))
        items = v
    out: list[Prompt] = []
    for i, p in enumerate(items):
        if isinstance(p, str):
            check(len(p) > 0, f"prompt[{i}]", "a non-empty string", p)
            out.append(TextPrompt(p))
        else:
            check(isinstance(p, list) and len(p) > 0 and all(isinstance(t, int) and not isinstance(t, bool)
                                                             for t in p), f"prompt[{i}]",
                  "a non-empty string or a non-empty list of token ids", p)
            check(all(0 <= t < vocab_size for t in p), f"prompt[{i}]", f"token ids in [0, {vocab_size})", p[:8])
            out.append(TokensPrompt(tuple(p)))
    return tuple(out)


def _media_part(part: dict[str, Any], where: str, counter: list[int], policy: MediaPolicy) -> MediaItem:
    kind = part["type"]
    counter[0] += 1
    if counter[0] > policy.max_items:
        raise ValidationError(f"Parameter {where} is one media part too many: at most {policy.max_items} "
                              f"per request (ServerConfig.maxMediaItems)")
    if kind == "image_url":
        v = part.get("image_url")
        url = v.get("url") if isinstance(v, dict) else v
        check(isinstance(url, str) and url.strip() != "", f"{where}.image_url.url",
              "a data: URI or an http(s) URL", url)
        return MediaItem(counter[0] - 1, "image", url)
    v = part.get("input_audio")
    check(isinstance(v, dict), f"{where}.input_audio", "an object {data, format}", v)
    data, fmt = v.get("data"), v.get("format")
    check(isinstance(fmt, str) and fmt in AUDIO_FORMATS, f"{where}.input_audio.format",
          f"one of {', '.join(AUDIO_FORMATS)}", fmt)
    check(isinstance(data, str) and data != "", f"{where}.input_audio.data", "base64-encoded audio", "...")
    try:
        base64.b64decode(data[:64] + "=" * (-len(data[:64]) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError(f"Parameter {where}.input_audio.data must be base64-encoded audio") from None
    return MediaItem(counter[0] - 1, "audio", f"data:{AUDIO_FORMATS[fmt]};base64,{data}")


def _messages(body: dict[str, Any], policy: MediaPolicy) -> ChatPrompt:
    v = body.get("messages")
    check(isinstance(v, list) and 0 < len(v) <= MAX_MESSAGES, "messages",
          f"a non-empty list of at most {MAX_MESSAGES} messages", v if not isinstance(v, list) else len(v))
    counter = [0]
    out: list[ChatMessage] = []
    for i, m in enumerate(v):
        where = f"messages[{i}]"
        check(isinstance(m, dict), where, "an object {role, content}", m)
        role = m.get("role")
        check(isinstance(role, str) and role in ROLES, f"{where}.role", "one of system, developer, user, assistant",
              role)
        extra = sorted(set(m) - {"role", "content", "name"})
        check(not extra, where, "an object with role, content and name only (tool calls are not supported)", extra)
        c = m.get("content")
        if isinstance(c, str):
            out.append(ChatMessage(ROLES[role], c))
            continue
        check(isinstance(c, list) and len(c) > 0, f"{where}.content", "a string or a non-empty list of parts", c)
        parts: list[Any] = []
        for j, part in enumerate(c):
            pw = f"{where}.content[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            check(kind in ("text", "image_url", "input_audio"), f"{pw}.type", "one of text, image_url, input_audio",
                  kind)
            if kind == "text":
                check(isinstance(part.get("text"), str), f"{pw}.text", "a string", part.get("text"))
                parts.append(part["text"])
            else:
                check(role == "user", f"{pw}.type", "text in a non-user message", kind)
                parts.append(_media_part(part, pw, counter, policy))
        out.append(ChatMessage(ROLES[role], tuple(parts)))
    return ChatPrompt(tuple(out))



def _logit_bias(v: Any, vocab_size: int) -> dict[int, float]:
    """OpenAI's ``logit_bias``: token ids (JSON object keys are strings) -> a bias in [-100, 100]."""
    if v is None:
        return {}
    check(isinstance(v, dict), "logit_bias", "an object of token id -> bias", v)
    check(len(v) <= MAX_LOGIT_BIAS, "logit_bias", f"at most {MAX_LOGIT_BIAS} entries", len(v))
    out: dict[int, float] = {}
    for key, bias in v.items():
        check(isinstance(key, str) and key.isdigit() and int(key) < vocab_size, "logit_bias",
              f"keys that are token ids in [0, {vocab_size})", key)
        check(isinstance(bias, (int, float)) and not isinstance(bias, bool) and -100 <= bias <= 100,
              f"logit_bias[{key}]", "a number in [-100, 100]", bias)
        out[int(key)] = float(bias)
    return out

def parse_openai(body: dict[str, Any], kind: Kind, *, support: Support, limits: ProtocolLimits, model: str,
                 defaults: RequestDefaults = RequestDefaults(), adapter_id: str | None = None,
                 request_id: str = "") -> OpenAIRequest:
    """Validate ``body``; raise ValidationError (the route answers 400) naming the parameter."""
    _check_fields(body, kind, support)
    stream = bool(get_bool(body, "stream", False))
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        check(stream, "stream_options", "absent unless stream is true", opts)
        check(isinstance(opts, dict) and set(opts) <= {"include_usage"}, "stream_options",
              "an object {include_usage}", opts)
        include_usage = bool(get_bool(opts, "include_usage", False))
    n = get_int(body, "n", Range(1, MAX_N, lo_open=False), 1) or 1
    prompts = (_completion_prompts(body, limits.vocab_size) if kind == "completion"
               else (_messages(body, limits.media_policy or MediaPolicy()),))
    check(len(prompts) * n <= MAX_CHOICES, "n", f"at most {MAX_CHOICES} choices in all (prompts x n)",
          f"{len(prompts)} x {n}")

    max_tokens = get_int(body, "max_tokens", Range(1, INT32_MAX, lo_open=False), None)
    if kind == "chat":
        max_tokens = get_int(body, "max_completion_tokens", Range(1, INT32_MAX, lo_open=False), max_tokens)
        default_max = defaults.max_tokens or INT32_MAX  # the engine caps it: maxIterTimes and the context
    else:
        default_max = defaults.max_tokens or COMPLETION_DEFAULT_MAX_TOKENS
    temperature = get_float(body, "temperature", Range(0.0, 2.0, lo_open=False), defaults.temperature)
    top_p = get_float(body, "top_p", Range(0.0, 1.0), defaults.top_p)
    stop = get_str_list(body, "stop", MAX_STOP_STRINGS, MAX_STOP_LEN)
    seed = get_int(body, "seed", Range(0, UINT64_MAX, lo_open=False), None)
    frequency_penalty = get_float(body, "frequency_penalty", Range(-2.0, 2.0, lo_open=False), 0.0)
    presence_penalty = get_float(body, "presence_penalty", Range(-2.0, 2.0, lo_open=False), 0.0)
    logit_bias = _logit_bias(body.get("logit_bias"), limits.vocab_size)
    get_str(body, "user", None)  # an end-user id for the caller's own records; nothing here uses it

    logprobs: int | None = None
    echo = False
    if kind == "completion":
        logprobs = get_int(body, "logprobs", Range(0, MAX_COMPLETION_LOGPROBS, lo_open=False), None)
        echo = bool(get_bool(body, "echo", False))
        _refuse(body, "suffix", "", "insertion (suffix) is not supported")
        get_int(body, "best_of", Range(1, MAX_N, lo_open=False), None)
        check(body.get("best_of") in (None, n), "best_of", f"absent or equal to n ({n}): "
              "server-side best-of selection is not supported on this route", body.get("best_of"))
    else:
        want = get_bool(body, "logprobs", False)
        top = get_int(body, "top_logprobs", Range(0, MAX_TOP_LOGPROBS, lo_open=False), None)
        check(top is None or want, "top_logprobs", "absent unless logprobs is true", top)
        logprobs = (top or 0) if want else None
        _refuse(body, "parallel_tool_calls", None, "tool calls are not supported")

    top_k = defaults.top_k
    repetition_penalty, ignore_eos = 1.0, False
    if support == "vllm":
        top_k = get_int(body, "top_k", Range(-1, INT32_MAX, lo_open=False), top_k)
        repetition_penalty = get_float(body, "repetition_penalty", Range(0.0), 1.0) or 1.0
        ignore_eos = bool(get_bool(body, "ignore_eos", False))
        min_tokens = get_int(body, "min_tokens", Range(0, INT32_MAX, lo_open=False), 0)
        check(min_tokens == 0, "min_tokens", "0 (a minimum output length is not implemented by the engine)",
              min_tokens)
    if top_k is not None and (top_k <= 0 or top_k >= limits.vocab_size):
        top_k = None  # -1 / 0 (Jan's "0") and the whole vocabulary mean off

    temp = 1.0 if temperature is None else temperature
    greedy = temp == 0.0
    params = SamplingParams(
        max_tokens=max_tokens or default_max, temperature=temp,
        top_k=0 if greedy else (top_k or 0), top_p=1.0 if greedy or top_p is None else top_p,
        repetition_penalty=repetition_penalty, frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty or 0.0, logit_bias=logit_bias, seed=seed, stop=stop,
        ignore_eos=ignore_eos, logprobs=logprobs or None, prompt_logprobs=echo, adapter_id=adapter_id)
    return OpenAIRequest(
        prompt=prompts[0], params=params, stream=stream, best_of=n, sampling=not greedy, kind=kind,
        model=model, prompts=prompts, echo=echo, logprobs=logprobs, include_usage=include_usage,
        request_id=request_id)

"""POST /v1/completions and /v1/chat/completions: OpenAI's request bodies -> an ``OpenAIRequest``.

Fields and ranges are the rule table's (``params.table.OPENAI_*``, ``VLLM``: OpenAI's documented ranges);
defaults are OpenAI's (max_tokens 16 on completions, up to the output cap on chat). vLLM's extra fields are
taken too, on every deployment (protocol.vllm_fields; ``openAiSupport`` only decides what /info advertises),
and vLLM's ``stream_options.continuous_usage_stats``. A field we cannot honour (suffix, ...) is refused by name
rather than ignored. The model picks its engine (``peek_model``) before the rest is parsed with that model's
request defaults; an adapter it names was resolved by the catalog.
"""
from __future__ import annotations

import base64
import binascii
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from mindie_service.errors import ValidationError, check
from mindie_service.inputs.types import ChatMessage, ChatPrompt, Prompt, TextPrompt, TokensPrompt
from mindie_service.params.defaults import RequestDefaults
from mindie_service.params.priority import read_rank
from mindie_service.params.rule import Field, FieldTable, read_fields
from mindie_service.params.table import BOOL, LOGIT_BIAS, OPENAI_CHAT, OPENAI_COMPLETION
from mindie_service.protocol.request import GenerationRequest, ProtocolLimits
from mindie_service.params.structured_field import read_structured
from mindie_service.protocol.validation import get_str, get_str_list
from mindie_service.protocol.tool_calls import ToolsRequest, message_tool_fields, parse_tools
from mindie_service.protocol.reasoning_fields import chat_reasoning
from mindie_service.protocol.openai_fields import CLIENT_FIELDS, ClientFields, client_fields, legacy_functions
from mindie_service.protocol.vllm_fields import FIELDS as VLLM_FIELDS, read_vllm
from mindie_service.structured.request_forms import one_of
from mindie_service.structured.tool_formats import ToolFormat, detect
from mindie_service.structured.grammar_spec import StructuredSpec
from mindie_service.sampling_params import INT32_MAX, MAX_LOGIT_BIAS, MAX_STOP_LEN, MAX_STOP_STRINGS, SamplingParams
from multimodal import MediaItem, MediaPolicy

Kind = Literal["completion", "chat"]

MAX_CHOICES = 64  # prompts x n
MAX_PROMPTS = 64
MAX_MESSAGES = 512
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default on /v1/completions
AUDIO_FORMATS = {"wav": "audio/wav", "mp3": "audio/mpeg", "flac": "audio/flac", "ogg": "audio/ogg"}

_COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "presence_penalty",
           "frequency_penalty", "logit_bias", "stream", "stream_options", "user", "logprobs", "response_format",
           "priority"}
_FIELDS: dict[str, frozenset[str]] = {
    "completion": frozenset(_COMMON | {"prompt", "echo", "suffix", "best_of"}),
    "chat": frozenset(_COMMON | CLIENT_FIELDS | {"messages", "max_completion_tokens", "top_logprobs",
                                                 "parallel_tool_calls", "tools", "tool_choice",
                                                 "chat_template_kwargs", "thinking_token_budget"}),
}
_TABLES: dict[Kind, FieldTable] = {"completion": OPENAI_COMPLETION, "chat": OPENAI_CHAT}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


@dataclass(frozen=True)
class OpenAIRequest(GenerationRequest):
    """One OpenAI call: ``prompts`` (completions may hold several), ``best_of`` = n choices per prompt."""

    kind: Kind = "completion"
    model: str = ""
    prompts: tuple[Prompt, ...] = ()
    echo: bool = False
    logprobs: int | None = None  # top alternatives per token (0: the chosen token only); None: no logprobs
    include_usage: bool = False
    continuous_usage: bool = False  # stream_options.continuous_usage_stats (vLLM's): usage in every chunk
    score_only: bool = False  # max_tokens 0 with echo: the prompt's logprobs, no completion (the engine makes one)
    request_id: str = ""  # the response's id is derived from it
    tools: ToolsRequest | None = None  # chat's tools, tool_choice, parallel_tool_calls (protocol.tool_calls)
    client: ClientFields = ClientFields()  # what the access log records (protocol.openai_fields)
    obfuscate: bool = False  # stream_options.include_obfuscation: stream chunks carry random padding
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def n(self) -> int:
        return self.best_of


# What huggingface_hub's InferenceClient(base_url=...).chat_completion sends as model: older versions "tgi",
# recent ones (2.x) "dummy" (when model is unset or a URL), others none; TGI's Messages API ignores it.
TGI_PLACEHOLDERS = frozenset({"tgi", "dummy"})


def peek_model(body: dict[str, Any], default: str | None = None) -> str:
    """The ``model`` field: which catalog model or adapter serves the request. With ``default`` (chat, as
    TGI's Messages API does), an absent ``model`` or a TGI client's placeholder (``TGI_PLACEHOLDERS``) names
    the default model."""
    v = body.get("model")
    if default is not None and (v is None or (isinstance(v, str) and v in TGI_PLACEHOLDERS)):
        return default
    check(isinstance(v, str) and 0 < len(v) <= 256, "model", "a non-empty string naming a model of /v1/models", v)
    return v


def _refuse(body: dict[str, Any], name: str, neutral: Any, why: str) -> None:
    v = body.get(name)
    if v is not None and v != neutral:
        raise ValidationError(f"Parameter {name} must be absent or {neutral!r} ({why}), got {v!r}")


def _check_fields(body: dict[str, Any], kind: Kind) -> None:
    allowed = _FIELDS[kind] | VLLM_FIELDS
    unknown = sorted(k for k in body if k not in allowed)
    if unknown:
        hint = f" (this route takes {', '.join(sorted(allowed))})"
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


def chat_messages(body: dict[str, Any], policy: MediaPolicy) -> ChatPrompt:
    v = body.get("messages")
    check(isinstance(v, list) and 0 < len(v) <= MAX_MESSAGES, "messages",
          f"a non-empty list of at most {MAX_MESSAGES} messages", v if not isinstance(v, list) else len(v))
    counter = [0]
    out: list[ChatMessage] = []
    for i, m in enumerate(v):
        where = f"messages[{i}]"
        check(isinstance(m, dict), where, "an object {role, content}", m)
        role = m.get("role")
        check(isinstance(role, str) and role in ROLES, f"{where}.role",
              "one of system, developer, user, assistant, tool", role)
        extra = sorted(set(m) - {"role", "content", "name", "tool_calls", "tool_call_id"})
        check(not extra, where, "an object of role, content, name, tool_calls, tool_call_id", extra)
        calls, call_id = message_tool_fields(m, where, role)
        c = m.get("content")
        if c is None and calls:
            c = ""
        if isinstance(c, str):
            out.append(ChatMessage(ROLES[role], c, calls, call_id))
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



def _with_tools(prompt: ChatPrompt, tools: ToolsRequest | None, kwargs: dict[str, Any]) -> ChatPrompt:
    """The chat prompt with the tools the model may call (tool_choice none: none shown) and the template's kwargs."""
    kw = tuple(sorted(kwargs.items()))
    if tools is None or not tools.active:
        return ChatPrompt(prompt.messages, (), tools.fmt if tools is not None else None, kw)
    return ChatPrompt(prompt.messages, tools.tools, tools.fmt, kw)


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
        out[int(key)] = LOGIT_BIAS.checked(bias, f"logit_bias[{key}]")
    return out

_STREAM_OPTIONS = {"include_usage": Field("include_usage", BOOL),
                   "include_obfuscation": Field("include_obfuscation", BOOL),
                   "continuous_usage_stats": Field("continuous_usage_stats", BOOL)}


def _stream_options(body: dict[str, Any], stream: bool) -> tuple[bool, bool, bool]:
    """``stream_options``: only with stream; its include_usage, include_obfuscation (OpenAI's padding of each
    chunk with random characters, so that a chunk's size does not tell its text's) and vLLM's
    continuous_usage_stats (each chunk carries the usage so far)."""
    opts = body.get("stream_options")
    if opts is None:
        return False, False, False
    check(stream, "stream_options", "absent unless stream is true", opts)
    check(isinstance(opts, dict) and set(opts) <= set(_STREAM_OPTIONS), "stream_options",
          "an object {include_usage, include_obfuscation, continuous_usage_stats}", opts)
    got = read_fields(opts, _STREAM_OPTIONS, "stream_options.")
    return (bool(got.get("include_usage", False)), bool(got.get("include_obfuscation", False)),
            bool(got.get("continuous_usage_stats", False)))


def _kind_rules(body: dict[str, Any], kind: Kind, v: dict[str, Any], n: int) -> None:
    """The rules one route adds: completions' suffix and best_of, chat's top_logprobs and tool calls."""
    if kind == "completion":
        _refuse(body, "suffix", "", "insertion (suffix) is not supported")
        check(body.get("best_of") in (None, n), "best_of", f"absent or equal to n ({n}): "
              "server-side best-of selection is not supported on this route", body.get("best_of"))
        return
    check(v.get("logprobs") is None or v.get("want_logprobs"), "top_logprobs", "absent unless logprobs is true",
          v.get("logprobs"))
    v["logprobs"] = (v.get("logprobs") or 0) if v.get("want_logprobs") else None


def _score_only(body: dict[str, Any], kind: Kind) -> tuple[dict[str, Any], bool]:
    """OpenAI's legacy ``echo`` + ``max_tokens: 0`` scores the prompt: the body the rule table reads then asks
    for one token (the engine always makes one; the encoder drops it), and the flag says so."""
    v = body.get("max_tokens")
    if v != 0 or isinstance(v, bool):
        return body, False
    check(kind == "completion" and body.get("echo") is True, "max_tokens",
          "at least 1 (0 only with echo: true on /v1/completions, which scores the prompt)", v)
    return {**body, "max_tokens": 1}, True


def _structured(body: dict[str, Any], tools: ToolsRequest | None) -> StructuredSpec | None:
    """``response_format`` (OpenAI's, or TGI's chat form), vLLM's ``structured_outputs`` / ``guided_*``, or the
    grammar of the tools the model may call."""
    fmt = read_structured(body, "openai")
    if tools is not None and tools.active:  # a reply that is not a call follows response_format (as OpenAI's)
        fmt, tools_spec = None, tools.spec(answer=fmt)
    else:
        tools_spec = None
    return one_of(("tools", tools_spec), ("response_format", fmt),
                  ("structured_outputs", read_structured(body, "vllm")))


def parse_openai(body: dict[str, Any], kind: Kind, *, limits: ProtocolLimits, model: str,
                 defaults: RequestDefaults = RequestDefaults(), adapter_id: str | None = None,
                 request_id: str = "", tool_format: ToolFormat | None = None) -> OpenAIRequest:
    """Validate ``body``; raise ValidationError (the route answers 400) naming the parameter. ``tool_format``:
    the model's tool-call format (structured.tool_formats; default: found from no template, hermes)."""
    _check_fields(body, kind)
    body, score_only = _score_only(body, kind)
    body, legacy = legacy_functions(body) if kind == "chat" else (body, False)
    client = client_fields(body)
    tools = parse_tools(body, tool_format or detect(None), legacy=legacy) if kind == "chat" else None
    think_budget, template_kw = chat_reasoning(body) if kind == "chat" else (None, {})
    v = read_fields(body, _TABLES[kind])
    stream, n = v.get("stream", False), v.get("n", 1)
    include_usage, obfuscate, continuous = _stream_options(body, stream)
    prompts = (_completion_prompts(body, limits.vocab_size) if kind == "completion"
               else (_with_tools(chat_messages(body, limits.media_policy or MediaPolicy()), tools, template_kw),))
    check(len(prompts) * n <= MAX_CHOICES, "n", f"at most {MAX_CHOICES} choices in all (prompts x n)",
          f"{len(prompts)} x {n}")
    # Without max_tokens: the model's default, else OpenAI's 16 on completions; chat leaves it to the output cap.
    default_max = defaults.max_tokens or (INT32_MAX if kind == "chat" else COMPLETION_DEFAULT_MAX_TOKENS)
    stop = get_str_list(body, "stop", MAX_STOP_STRINGS, MAX_STOP_LEN)
    logit_bias = _logit_bias(body.get("logit_bias"), limits.vocab_size)
    get_str(body, "user", None)  # an end-user id for the caller's own records; nothing here uses it
    _kind_rules(body, kind, v, n)
    x = read_vllm(body, defaults, limits.vocab_size)
    temp = v.get("temperature", 1.0 if defaults.temperature is None else defaults.temperature)
    top_p = v.get("top_p", defaults.top_p)
    greedy = temp == 0.0
    echo = v.get("echo", False)
    params = SamplingParams(
        max_tokens=min(v.get("max_tokens", default_max), defaults.max_tokens_cap or INT32_MAX), temperature=temp,
        top_k=0 if greedy else (x["top_k"] or 0), top_p=1.0 if greedy or top_p is None else top_p,
        min_p=0.0 if greedy else x["min_p"], stop_token_ids=x["stop_token_ids"],
        repetition_penalty=x["repetition_penalty"], frequency_penalty=v.get("frequency_penalty", 0.0),
        presence_penalty=v.get("presence_penalty", 0.0), logit_bias=logit_bias, seed=v.get("seed"), stop=stop,
        ignore_eos=x["ignore_eos"], min_tokens=x["min_tokens"], logprobs=v.get("logprobs") or None,
        prompt_logprobs=echo,
        adapter_id=adapter_id, structured_outputs=_structured(body, tools),
        cache_key=client.prompt_cache_key, split_reasoning=kind == "chat", thinking_budget=think_budget)
    return OpenAIRequest(
        prompt=prompts[0], params=params, truncate=x["truncate"], stream=stream, best_of=n, sampling=not greedy,
        kind=kind, model=model, prompts=prompts, echo=echo, logprobs=v.get("logprobs"), include_usage=include_usage,
        score_only=score_only, request_id=request_id, tools=tools, client=client, obfuscate=obfuscate,
        continuous_usage=continuous,
        rank=read_rank(body, "vllm"))

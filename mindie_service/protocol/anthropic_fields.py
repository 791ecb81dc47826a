"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages request -> the neutral chat request the
OpenAI chat route builds (the same ``ChatPrompt``, tools and ``SamplingParams``), so a conversation gets the same
tokens through either dialect.

- ``system``: a string or text blocks (joined as the chat route joins text parts).
- ``messages``: user and assistant turns, content a string or blocks: ``text``, ``image`` (``base64`` or ``url``
  source, fetched through the media guards as chat's image parts are), ``tool_use`` (assistant: a call) and
  ``tool_result`` (user: a tool message answering the call; ``is_error`` prefixes its text with "Error: ").
  The conversation must end with a user turn (prefilling the assistant's reply is not supported).
- ``tools`` (custom tools: name, description, input_schema) and ``tool_choice`` (auto / any / tool / none,
  ``disable_parallel_tool_use``): the chat route's tools, grammar-enforced the same way.
- ``max_tokens`` (required), ``stop_sequences``, ``temperature`` ([0, 1], default 1.0 as Anthropic's),
  ``top_p`` and ``top_k`` (default off) read from the body: the 2.x SDK takes them through ``extra_body``.
- ``metadata.user_id``: recorded in the access log as the end user (OpenAI's safety_identifier).
- ``thinking``: ``enabled`` with ``budget_tokens`` (the engine's thinking budget) or ``disabled`` (the template's
  ``enable_thinking: false``), protocol.reasoning_fields; the answer's ``thinking`` blocks come from the engine's
  split (a model whose template does not think has none). An assistant turn's ``thinking`` and
  ``redacted_thinking`` blocks are taken and dropped (chat templates drop earlier turns' thinking); ``service_tier``:
  ``auto`` / ``standard_only`` (one tier here). ``cache_control`` on blocks
  is taken: the prefix cache keeps every prompt's KV without being asked.
Any other field is refused by name."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from mindie_service.errors import ValidationError, check
from mindie_service.inputs.types import ChatMessage, ChatPrompt
from mindie_service.params.rule import read_fields
from mindie_service.params.table import ANTHROPIC
from mindie_service.protocol.openai_fields import ClientFields
from mindie_service.protocol.reasoning_fields import messages_thinking
from mindie_service.protocol.request import GenerationRequest
from mindie_service.protocol.tool_calls import ToolsRequest, parse_tools
from mindie_service.protocol.validation import get_str_list
from mindie_service.sampling_params import MAX_STOP_LEN, MAX_STOP_STRINGS, SamplingParams
from mindie_service.structured.tool_formats import ToolFormat, detect
from multimodal import MediaItem, MediaPolicy

MAX_MESSAGES = 512
DEFAULT_TEMPERATURE = 1.0  # Anthropic's
COUNT_FIELDS = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking"})
FIELDS = COUNT_FIELDS | {"max_tokens", "stop_sequences", "temperature", "top_p", "top_k", "metadata", "stream",
                         "service_tier"}
IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


@dataclass(frozen=True)
class AnthropicRequest(GenerationRequest):
    """One Messages call: a chat prompt (with its tools) and its sampling, as the chat route's."""

    model: str = ""
    request_id: str = ""
    tools: ToolsRequest | None = None
    stop_sequences: tuple[str, ...] = ()
    client: ClientFields = ClientFields()
    created: int = field(default_factory=lambda: int(time.time()))


def _text(block: dict[str, Any], where: str) -> str:
    check(isinstance(block.get("text"), str), f"{where}.text", "a string", block.get("text"))
    extra = sorted(set(block) - {"type", "text", "cache_control"})
    check(not extra, where, "a text block of type, text, cache_control", extra)
    return block["text"]


def _image(block: dict[str, Any], where: str, counter: list[int], policy: MediaPolicy) -> MediaItem:
    src = block.get("source")
    check(isinstance(src, dict) and src.get("type") in ("base64", "url"), f"{where}.source",
          'an object {"type": "base64", "media_type", "data"} or {"type": "url", "url"}', src)
    counter[0] += 1
    if counter[0] > policy.max_items:
        raise ValidationError(f"Parameter {where} is one image too many: at most {policy.max_items} per request "
                              f"(ServerConfig.maxMediaItems)")
    if src["type"] == "url":
        check(isinstance(src.get("url"), str) and src["url"].strip() != "", f"{where}.source.url", "an http(s) URL",
              src.get("url"))
        return MediaItem(counter[0] - 1, "image", src["url"])
    check(src.get("media_type") in IMAGE_TYPES, f"{where}.source.media_type", f"one of {', '.join(IMAGE_TYPES)}",
          src.get("media_type"))
    check(isinstance(src.get("data"), str) and src["data"] != "", f"{where}.source.data", "base64 image data", "...")
    return MediaItem(counter[0] - 1, "image", f"data:{src['media_type']};base64,{src['data']}")


def _tool_result(block: dict[str, Any], where: str) -> ChatMessage:
    tid = block.get("tool_use_id")
    check(isinstance(tid, str) and tid != "", f"{where}.tool_use_id", "the id of the tool_use this answers", tid)
    c = block.get("content", "")
    if isinstance(c, list):
        texts = []
        for k, b in enumerate(c):
            check(isinstance(b, dict) and b.get("type") == "text", f"{where}.content[{k}].type",
                  "text (a tool result's images are not supported)", b.get("type") if isinstance(b, dict) else b)
            texts.append(_text(b, f"{where}.content[{k}]"))
        c = "\n".join(texts)
    check(isinstance(c, str), f"{where}.content", "a string or a list of text blocks", c)
    check(block.get("is_error") in (None, True, False), f"{where}.is_error", "a boolean", block.get("is_error"))
    return ChatMessage("tool", f"Error: {c}" if block.get("is_error") else c, (), tid)


def _tool_use(block: dict[str, Any], where: str) -> tuple[str, str, str]:
    check(isinstance(block.get("id"), str) and isinstance(block.get("name"), str), where,
          'a block {"type": "tool_use", "id", "name", "input"}', {k: block.get(k) for k in ("id", "name")})
    check(isinstance(block.get("input", {}), dict), f"{where}.input", "an object", block.get("input"))
    # compact, as the call grammar has the model write it: the history renders as the model wrote the call
    return block["id"], block["name"], json.dumps(block.get("input", {}), ensure_ascii=False, separators=(",", ":"))


def _turn(m: Any, where: str, counter: list[int], policy: MediaPolicy) -> list[ChatMessage]:
    """One Anthropic turn as chat messages: a user turn's tool results first become tool messages."""
    check(isinstance(m, dict) and m.get("role") in ("user", "assistant"), f"{where}.role", "user or assistant",
          m.get("role") if isinstance(m, dict) else m)
    extra = sorted(set(m) - {"role", "content"})
    check(not extra, where, "an object of role, content", extra)
    role, c = m["role"], m.get("content")
    if isinstance(c, str):
        return [ChatMessage(role, c)]
    check(isinstance(c, list) and len(c) > 0, f"{where}.content", "a string or a non-empty list of blocks", c)
    out: list[ChatMessage] = []
    parts: list[Any] = []
    calls: list[tuple[str, str, str]] = []
    allowed = ("text", "image", "tool_result") if role == "user" else ("text", "tool_use", "thinking",
                                                                         "redacted_thinking")
    for j, b in enumerate(c):
        at = f"{where}.content[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        check(kind in allowed, f"{at}.type", f"one of {', '.join(allowed)} in a{'n' * (role == 'assistant')} "
              f"{role} turn", kind)
        if kind == "text":
            parts.append(_text(b, at))
        elif kind == "image":
            parts.append(_image(b, at, counter, policy))
        elif kind == "tool_result":
            out.append(_tool_result(b, at))
        elif kind in ("thinking", "redacted_thinking"):
            continue  # earlier thinking: the template leaves it out of the prompt
        else:
            calls.append(_tool_use(b, at))
    if role == "assistant":
        return [ChatMessage(role, "\n".join(parts), tuple(calls))]
    if parts:
        out.append(ChatMessage(role, tuple(parts)))
    return out


def _system(v: Any) -> list[ChatMessage]:
    if v is None:
        return []
    if isinstance(v, str):
        return [ChatMessage("system", v)]
    check(isinstance(v, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in v), "system",
          "a string or a list of text blocks", v)
    return [ChatMessage("system", tuple(_text(b, f"system[{i}]") for i, b in enumerate(v)))] if v else []


def _messages(body: dict[str, Any], policy: MediaPolicy) -> list[ChatMessage]:
    v = body.get("messages")
    check(isinstance(v, list) and 0 < len(v) <= MAX_MESSAGES, "messages",
          f"a non-empty list of at most {MAX_MESSAGES} turns", v if not isinstance(v, list) else len(v))
    counter = [0]
    out = _system(body.get("system"))
    for i, m in enumerate(v):
        out += _turn(m, f"messages[{i}]", counter, policy)
    check(v[-1].get("role") == "user", f"messages[{len(v) - 1}].role",
          "user: the conversation must end with a user turn (prefilling the assistant's reply is not supported)",
          v[-1].get("role"))
    return out


def _tools(body: dict[str, Any], fmt: ToolFormat) -> ToolsRequest | None:
    raw, choice = body.get("tools"), body.get("tool_choice")
    if raw is None and choice is None:
        return None
    check(raw is None or isinstance(raw, list), "tools", "a list of tools", raw)
    tools = []
    for i, t in enumerate(raw or []):
        check(isinstance(t, dict) and t.get("type", "custom") == "custom", f"tools[{i}]",
              'a custom tool {"name", "description"?, "input_schema"} (server tools are not available here)',
              t.get("type") if isinstance(t, dict) else t)
        extra = sorted(set(t) - {"type", "name", "description", "input_schema", "cache_control"})
        check(not extra, f"tools[{i}]", "an object of name, description, input_schema, cache_control", extra)
        f = {"name": t.get("name"), "parameters": t.get("input_schema", {"type": "object"})}
        if t.get("description") is not None:
            f["description"] = t["description"]
        tools.append({"type": "function", "function": f})
    mapped: Any = None
    parallel: bool | None = None
    if choice is not None:
        check(isinstance(choice, dict) and choice.get("type") in ("auto", "any", "tool", "none"), "tool_choice",
              '{"type": "auto" | "any" | "tool" | "none", "name"?, "disable_parallel_tool_use"?}', choice)
        kind = choice["type"]
        mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind) or \
            {"type": "function", "function": {"name": choice.get("name")}}
        dp = choice.get("disable_parallel_tool_use")
        check(dp is None or isinstance(dp, bool), "tool_choice.disable_parallel_tool_use", "a boolean", dp)
        parallel = None if dp is None else not dp
    try:
        return parse_tools({"tools": tools, "tool_choice": mapped, "parallel_tool_calls": parallel}, fmt)
    except ValidationError as e:  # the chat route's words: .function.parameters is Anthropic's .input_schema
        raise ValidationError(e.message.replace(".function.parameters", ".input_schema")
                              .replace(".function.name", ".name").replace("tool_choice.function.name",
                                                                          "tool_choice.name")) from None


def _refusals(body: dict[str, Any]) -> None:
    unknown = sorted(k for k in body if k not in FIELDS)
    if unknown:
        raise ValidationError(f"Parameter {unknown[0]} is not supported on /v1/messages (it takes "
                              f"{', '.join(sorted(FIELDS))}), got {body[unknown[0]]!r}")
    check(body.get("service_tier") in (None, "auto", "standard_only"), "service_tier",
          "auto or standard_only (every request is served at one tier here)", body.get("service_tier"))


def prompt_of(body: dict[str, Any], fmt: ToolFormat | None,
              policy: MediaPolicy) -> tuple[ChatPrompt, ToolsRequest | None]:
    """The chat prompt and tools of a Messages body (also /v1/messages/count_tokens')."""
    fmt = fmt or detect(None)
    tools = _tools(body, fmt)
    messages = tuple(_messages(body, policy))
    shown = tools.tools if tools is not None and tools.active else ()
    kwargs = messages_thinking(body.get("thinking"), body.get("max_tokens"))[1]
    return ChatPrompt(messages, shown, fmt, tuple(sorted(kwargs.items()))), tools


def parse_count_tokens(body: dict[str, Any], fmt: ToolFormat | None, policy: MediaPolicy) -> ChatPrompt:
    unknown = sorted(k for k in body if k not in COUNT_FIELDS)
    if unknown:
        raise ValidationError(f"Parameter {unknown[0]} is not supported on /v1/messages/count_tokens (it takes "
                              f"{', '.join(sorted(COUNT_FIELDS))}), got {body[unknown[0]]!r}")
    _refusals(body)
    return prompt_of(body, fmt, policy)[0]


def parse_messages(body: dict[str, Any], *, model: str, policy: MediaPolicy, vocab_size: int,
                   adapter_id: str | None = None, request_id: str = "",
                   tool_format: ToolFormat | None = None) -> AnthropicRequest:
    """Validate ``body``; raise ValidationError (400 in Anthropic's shape) naming the field."""
    _refusals(body)
    check("max_tokens" in body, "max_tokens", "given (an integer >= 1: the Messages API requires it)", None)
    v = read_fields(body, ANTHROPIC)
    prompt, tools = prompt_of(body, tool_format, policy)
    stop = get_str_list(body, "stop_sequences", MAX_STOP_STRINGS, MAX_STOP_LEN)
    meta = body.get("metadata")
    check(meta is None or (isinstance(meta, dict) and set(meta) <= {"user_id"}
                           and (meta.get("user_id") is None or (isinstance(meta["user_id"], str)
                                                               and 0 < len(meta["user_id"]) <= 256
                                                               and meta["user_id"].isprintable()))),
          "metadata", 'an object {"user_id": a printable string of at most 256 characters}', meta)
    temp = v.get("temperature", DEFAULT_TEMPERATURE)
    greedy = temp == 0.0
    top_k = v.get("top_k")
    params = SamplingParams(
        max_tokens=v["max_tokens"], temperature=temp,
        top_k=0 if greedy or not top_k or top_k >= vocab_size else top_k,
        top_p=1.0 if greedy else v.get("top_p", 1.0), stop=stop, adapter_id=adapter_id,
        structured_outputs=tools.spec() if tools is not None else None, split_reasoning=True,
        thinking_budget=messages_thinking(body.get("thinking"), v["max_tokens"])[0])
    return AnthropicRequest(prompt=prompt, params=params, stream=v.get("stream", False), sampling=not greedy,
                            model=model, request_id=request_id, tools=tools, stop_sequences=tuple(stop),
                            client=ClientFields((meta or {}).get("user_id")))

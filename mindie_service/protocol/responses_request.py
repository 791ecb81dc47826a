"""POST /v1/responses: OpenAI's Responses body -> a ``ResponsesRequest``.

The Responses fields map onto chat's (``CHAT_NAMES``) and the chat parser reads them (one parameter table,
``params.table.OPENAI_CHAT``; one prompt renderer), so a Responses call and the chat call of the same
conversation make the same engine request: greedy output is identical. What Responses adds is read here:
``instructions`` (a system message first), ``input`` items (protocol.responses_input), the flat function
tools, ``text.format``, ``include``, ``truncation``, ``metadata``, ``store``, ``background`` and
``previous_response_id`` (the handler prepends the stored conversation), ``reasoning.effort`` (chat's
``reasoning_effort``: a thinking budget, or no thinking). vLLM's ``priority`` is taken as on the other OpenAI
routes (params.priority: lower first, 0 the default). A field we cannot honour (built-in tools such as
web_search, ``reasoning.summary``, ``conversation``) is refused by name."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mindie_service.errors import ValidationError, check
from mindie_service.protocol.openai import OpenAIRequest, parse_openai
from mindie_service.protocol.responses_input import input_items, to_messages

FIELDS = frozenset({"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
                    "max_output_tokens", "temperature", "top_p", "top_logprobs", "metadata", "user", "store",
                    "include", "truncation", "stream", "background", "previous_response_id", "reasoning",
                    "service_tier", "stream_options", "priority"})
INCLUDABLE = frozenset({"message.output_text.logprobs"})
# chat's name -> the Responses field it came from (an error names the field the client wrote)
CHAT_NAMES = {"max_completion_tokens": "max_output_tokens", "reasoning_effort": "reasoning.effort", "response_format": "text.format",
              "top_logprobs": "top_logprobs", "messages": "input", "logprobs": "include"}
MAX_METADATA = 16


@dataclass(frozen=True)
class ResponsesOptions:
    """What a Responses call asks beyond the generation: echoed in the response object and the store."""

    instructions: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    store: bool = True
    background: bool = False
    previous_response_id: str | None = None
    include: tuple[str, ...] = ()
    truncation: str = "disabled"
    user: str | None = None
    text_format: dict[str, Any] = field(default_factory=lambda: {"type": "text"})
    tools: tuple[dict[str, Any], ...] = ()  # as the client wrote them (the response object echoes them)
    tool_choice: Any = "auto"
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    reasoning_effort: str | None = None
    obfuscate: bool = False  # stream_options.include_obfuscation: delta events carry random padding


@dataclass(frozen=True)
class ResponsesRequest:
    """The parsed call: its chat-equivalent request (what the engine runs) and the Responses options."""

    chat: OpenAIRequest
    options: ResponsesOptions
    items: tuple[dict[str, Any], ...]  # this call's input items (stored; a follow-up prepends them)
    body: dict[str, Any]  # the body as sent (stored: a restart re-parses it to resume)

    @property
    def stream(self) -> bool:
        return self.chat.stream


def _refuse_unknown(body: dict[str, Any]) -> None:
    unknown = sorted(k for k in body if k not in FIELDS)
    if unknown:
        raise ValidationError(f"Parameter {unknown[0]} is not supported on /v1/responses "
                              f"(this route takes {', '.join(sorted(FIELDS))})")
    for name, ok in (("service_tier", (None, "auto", "default")),):
        if body.get(name) not in ok:
            raise ValidationError(f"Parameter {name} must be absent or one of {ok!r} "
                                  f"(not supported by this server), got {body[name]!r}")


def _reasoning(v: Any) -> str | None:
    """``reasoning.effort`` (None: the template's default). A summary is refused: the reasoning items carry the
    thinking text itself, and nothing here writes summaries of it."""
    if v is None:
        return None
    check(isinstance(v, dict) and set(v) <= {"effort", "summary", "generate_summary"}, "reasoning",
          "an object {effort, summary}", v)
    for name in ("summary", "generate_summary"):
        check(v.get(name) is None, f"reasoning.{name}", "absent or null (no summaries are written here: the "
              "reasoning items carry the thinking text itself)", v.get(name))
    return v.get("effort")


def _tool(t: Any, where: str) -> dict[str, Any]:
    kind = t.get("type") if isinstance(t, dict) else None
    check(kind == "function", f"{where}.type", "function (built-in tools such as web_search, file_search or "
          "code_interpreter are not served here)", kind)
    extra = sorted(set(t) - {"type", "name", "description", "parameters", "strict"})
    check(not extra, where, "an object of type, name, description, parameters, strict", extra)
    fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
    return {"type": "function", "function": fn}


def _tool_choice(v: Any) -> Any:
    if v is None or isinstance(v, str):
        return v
    check(isinstance(v, dict) and v.get("type") == "function" and isinstance(v.get("name"), str), "tool_choice",
          'none, auto, required or {"type": "function", "name"}', v)
    return {"type": "function", "function": {"name": v["name"]}}


def _text_format(text: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(``text.format`` as echoed, chat's ``response_format`` or None)."""
    if text is None:
        return {"type": "text"}, None
    check(isinstance(text, dict) and set(text) <= {"format", "verbosity"}, "text", "an object {format, verbosity}",
          text)
    check(text.get("verbosity") in (None, "medium"), "text.verbosity", "absent or medium (not adjustable here)",
          text.get("verbosity"))
    fmt = text.get("format") or {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    check(kind in ("text", "json_object", "json_schema"), "text.format.type", "text, json_object or json_schema",
          kind)
    if kind == "text":
        return fmt, None
    if kind == "json_object":
        return fmt, {"type": "json_object"}
    extra = sorted(set(fmt) - {"type", "name", "schema", "strict", "description"})
    check(not extra, "text.format", "an object of type, name, schema, strict, description", extra)
    check(isinstance(fmt.get("schema"), dict), "text.format.schema", "a JSON Schema object", fmt.get("schema"))
    js = {k: fmt[k] for k in ("name", "schema", "strict", "description") if fmt.get(k) is not None}
    return fmt, {"type": "json_schema", "json_schema": js}


def _metadata(v: Any) -> dict[str, str]:
    if v is None:
        return {}
    check(isinstance(v, dict) and len(v) <= MAX_METADATA, "metadata",
          f"an object of at most {MAX_METADATA} string pairs", v)
    for k, x in v.items():
        check(isinstance(k, str) and len(k) <= 64 and isinstance(x, str) and len(x) <= 512, f"metadata.{k}",
              "a string of at most 512 characters (keys at most 64)", x)
    return dict(v)


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    v = body.get(name)
    check(v is None or isinstance(v, bool), name, "a boolean", v)
    return default if v is None else v


def _include(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    check(isinstance(v, list), "include", "a list", v)
    for x in v:
        check(x in INCLUDABLE, "include", f"items among {', '.join(sorted(INCLUDABLE))}", x)
    return tuple(v)


def chat_body(body: dict[str, Any], messages: list[dict[str, Any]], text_format: dict[str, Any] | None,
              include: tuple[str, ...]) -> dict[str, Any]:
    """The chat completions body of the same call."""
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    for src, dst in (("temperature", "temperature"), ("top_p", "top_p"), ("max_output_tokens", "max_completion_tokens"),
                     ("parallel_tool_calls", "parallel_tool_calls"), ("user", "user"), ("stream", "stream"),
                     ("priority", "priority")):
        if body.get(src) is not None:
            out[dst] = body[src]
    effort = _reasoning(body.get("reasoning"))
    if effort is not None:
        out["reasoning_effort"] = effort
    if body.get("tools") is not None:
        check(isinstance(body["tools"], list), "tools", "a list of function tools", body["tools"])
        out["tools"] = [_tool(t, f"tools[{i}]") for i, t in enumerate(body["tools"])]
    if body.get("tool_choice") is not None:
        out["tool_choice"] = _tool_choice(body["tool_choice"])
    if text_format is not None:
        out["response_format"] = text_format
    if "message.output_text.logprobs" in include or body.get("top_logprobs") is not None:
        out["logprobs"] = True
        out["top_logprobs"] = body.get("top_logprobs") or 0
    return out


def _renamed(e: ValidationError) -> ValidationError:
    msg = e.message
    for chat, ours in CHAT_NAMES.items():
        if msg.startswith(f"Parameter {chat}"):
            msg = f"Parameter {ours}" + msg[len(f"Parameter {chat}"):]
            break
    return ValidationError(msg)


def parse_responses(body: dict[str, Any], history: list[dict[str, Any]], **chat_kw: Any) -> ResponsesRequest:
    """Validate ``body`` (``history``: the stored items a ``previous_response_id`` names, prepended);
    ``chat_kw``: parse_openai's deployment arguments. ValidationError names the Responses field."""
    _refuse_unknown(body)
    check(body.get("input") is not None, "input", "a string or a list of items", None)
    items = input_items(body["input"])
    instructions = body.get("instructions")
    check(instructions is None or isinstance(instructions, str), "instructions", "a string", instructions)
    messages = to_messages(history, "previous_response_id") if history else []
    messages += to_messages(items)
    if instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    check(bool(messages), "input", "at least one message", body.get("input"))
    fmt, response_format = _text_format(body.get("text"))
    include = _include(body.get("include"))
    truncation = body.get("truncation") or "disabled"
    check(truncation in ("disabled", "auto"), "truncation", "auto or disabled", truncation)
    prev = body.get("previous_response_id")
    check(prev is None or isinstance(prev, str), "previous_response_id", "a response id", prev)
    cb = chat_body(body, messages, response_format, include)
    try:
        chat = parse_openai(cb, "chat", **chat_kw)
    except ValidationError as e:
        raise _renamed(e) from None
    opts = ResponsesOptions(
        instructions=instructions, metadata=_metadata(body.get("metadata")), store=_flag(body, "store", True),
        background=_flag(body, "background", False), previous_response_id=prev, include=include,
        truncation=truncation, user=body.get("user"), text_format=fmt, tools=tuple(body.get("tools") or ()),
        tool_choice=body.get("tool_choice") or "auto", max_output_tokens=body.get("max_output_tokens"),
        temperature=body.get("temperature"), top_p=body.get("top_p"), top_logprobs=body.get("top_logprobs"),
        reasoning_effort=_reasoning(body.get("reasoning")), obfuscate=_obfuscate(body))
    if opts.background:
        check(opts.store, "background", "false unless store is true (a background response lives in the store)",
              True)
    return ResponsesRequest(chat, opts, tuple(items), body)


def _obfuscate(body: dict[str, Any]) -> bool:
    """``stream_options`` (only with ``stream: true``): ``include_obfuscation`` pads each delta event with an
    ``obfuscation`` string of random length, as OpenAI's stream does, so a frame's size tells nothing of its text."""
    so = body.get("stream_options")
    check(so is None or (body.get("stream") is True and isinstance(so, dict) and set(so) <= {"include_obfuscation"}
                         and so.get("include_obfuscation") in (None, True, False)), "stream_options",
          "absent unless stream is true, and at most {include_obfuscation: true | false}", so)
    return bool(so and so.get("include_obfuscation"))

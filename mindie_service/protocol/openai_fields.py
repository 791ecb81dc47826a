"""The OpenAI chat fields that current clients send beside the generation's own (openai 3.x, the Agents SDK,
LangChain, huggingface_hub), each given the effect it can have here, or refused by name where the value asks
for what this server cannot do:

- ``store`` and ``metadata`` (at most 16 string pairs, OpenAI's bounds): ``store: true`` on chat keeps the
  completion with its metadata and messages in the stored-completions store (storage.chat_store; read back by
  ``GET /v1/chat/completions[/{id}[/messages]]``, as OpenAI's); the legacy completions route stores nothing, so
  its field list refuses it. ``metadata`` without ``store`` is accepted (OpenAI does not echo it in the completion).
- ``service_tier``: ``auto`` and ``default`` are what every request gets; other tiers are refused.
- ``reasoning_effort``: a thinking budget, or no thinking (protocol.reasoning_fields checks and maps it).
- ``verbosity``: ``medium`` (OpenAI's default) only: nothing here makes answers shorter or longer.
- ``modalities``: ``["text"]`` only; ``audio``: null only (no audio output); ``web_search_options``: null only
  (no web search); ``prediction`` (predicted outputs) refused: nothing here drafts from a client's prediction.
- ``prompt_cache_key``: a routing hint where several instances serve the model (``instanceRouting: "prefix"``):
  without a longer cached prefix elsewhere, a request goes where its key went last (fleet.prefix_routing); the
  prefix cache itself needs no key (it shares KV by the prompt's own tokens). It and ``safety_identifier`` are
  recorded in the access log beside the request id (an operator can follow a cache group or an end user).
- ``functions`` / ``function_call`` (the legacy form): mapped to ``tools`` / ``tool_choice`` (one call, no
  parallel calls), answered in the legacy shape (``message.function_call``, finish_reason ``function_call``);
  history messages with ``function_call`` and ``role: "function"`` map to tool calls and tool results."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mindie_service.errors import ValidationError, check

MAX_METADATA = 16
MAX_ID_CHARS = 512  # prompt_cache_key / safety_identifier: OpenAI's ids are short (a hash or a user id)
CLIENT_FIELDS = frozenset({"metadata", "store", "service_tier", "reasoning_effort", "prompt_cache_key",
                           "safety_identifier", "verbosity", "modalities", "prediction", "audio",
                           "web_search_options", "functions", "function_call"})
_ACCEPTED = {  # field -> (values that ask for what is done anyway, why another value cannot be honoured)
    "service_tier": (("auto", "default"), "every request is served at one tier here"),
    "verbosity": (("medium",), "nothing here makes answers shorter or longer than the model writes them"),
    "audio": ((), "this server writes no audio output"),
    "web_search_options": ((), "this server has no web search"),
    "prediction": ((), "predicted outputs are not used here (speculation drafts from the prompt, not a client's "
                       "prediction)"),
}


@dataclass(frozen=True)
class ClientFields:
    """What the access log records of a request (server/app.log_request), and whether (with what metadata) the
    completion is stored."""

    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    store: bool = False
    metadata: tuple[tuple[str, str], ...] = ()


def _id(body: dict[str, Any], name: str) -> str | None:
    v = body.get(name)
    check(v is None or (isinstance(v, str) and 0 < len(v) <= MAX_ID_CHARS and v.isprintable()), name,
          f"a printable string of 1 to {MAX_ID_CHARS} characters", v)
    return v


def metadata(v: Any, where: str = "metadata") -> dict[str, str] | None:
    """OpenAI's metadata: at most 16 pairs, keys up to 64 characters, values up to 512."""
    if v is None:
        return None
    check(isinstance(v, dict) and len(v) <= MAX_METADATA
          and all(isinstance(k, str) and 0 < len(k) <= 64 and isinstance(x, str) and len(x) <= 512
                  for k, x in v.items()), where,
          f"an object of at most {MAX_METADATA} string pairs (keys up to 64 characters, values up to 512)", v)
    return dict(v)


def client_fields(body: dict[str, Any]) -> ClientFields:
    """Check the fields above (ValidationError naming the field and why) and keep what the log records and the
    store keeps (the completions route never gets here with ``store``: its field list refuses it)."""
    for name, (ok, why) in _ACCEPTED.items():
        v = body.get(name)
        if v is not None and v not in ok:
            allowed = ", ".join(repr(x) for x in ok) or "null"
            raise ValidationError(f"Parameter {name} must be absent or {allowed} ({why}), got {v!r}")
    meta = metadata(body.get("metadata")) or {}
    mods = body.get("modalities")
    check(mods is None or mods == ["text"], "modalities", '["text"] (this server writes text only)', mods)
    store = body.get("store")
    check(store is None or isinstance(store, bool), "store", "a boolean", store)
    return ClientFields(_id(body, "safety_identifier"), _id(body, "prompt_cache_key"), bool(store),
                        tuple(meta.items()))


def _legacy_choice(v: Any) -> Any:
    if v is None or v in ("none", "auto"):
        return v
    check(isinstance(v, dict) and isinstance(v.get("name"), str), "function_call",
          'none, auto or {"name": <one of functions>}', v)
    return {"type": "function", "function": {"name": v["name"]}}


def _legacy_message(m: Any) -> Any:
    if not isinstance(m, dict):
        return m
    if m.get("role") == "function":  # a legacy function result: a tool message answering the call by name
        out = {"role": "tool", "content": m.get("content"), "tool_call_id": f"call_{m.get('name', '')}"}
        return out
    fc = m.get("function_call")
    if fc is None:
        return m
    check(m.get("role") == "assistant" and isinstance(fc, dict) and isinstance(fc.get("name"), str),
          "messages[].function_call", 'an object {"name", "arguments"} on an assistant message', fc)
    rest = {k: v for k, v in m.items() if k != "function_call"}
    return {**rest, "tool_calls": [{"id": f"call_{fc['name']}", "type": "function", "function": fc}]}


def legacy_functions(body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """``body`` with the legacy ``functions`` / ``function_call`` (and such history messages) as ``tools`` /
    ``tool_choice``; True when the request is in the legacy form (its answer is then too)."""
    fns, call = body.get("functions"), body.get("function_call")
    if fns is None and call is None:
        msgs = body.get("messages")
        if isinstance(msgs, list) and any(isinstance(m, dict) and ("function_call" in m or m.get("role") == "function")
                                          for m in msgs):
            return {**body, "messages": [_legacy_message(m) for m in msgs]}, False
        return body, False
    check(body.get("tools") is None and body.get("tool_choice") is None, "functions",
          "absent when tools or tool_choice are given (functions is their legacy form)", "both given")
    check(isinstance(fns, list), "functions", "a list of {name, description?, parameters?}", fns)
    for i, f in enumerate(fns):
        check(isinstance(f, dict) and isinstance(f.get("name"), str), f"functions[{i}]",
              "an object {name, description?, parameters?}", f)
    out = {k: v for k, v in body.items() if k not in ("functions", "function_call")}
    out["tools"] = [{"type": "function", "function": f} for f in fns]
    out["tool_choice"] = _legacy_choice(call)
    out["parallel_tool_calls"] = False
    if isinstance(body.get("messages"), list):
        out["messages"] = [_legacy_message(m) for m in body["messages"]]
    return out, True

"""The Responses API's ``input`` items -> chat messages (the chat route's shapes), so a conversation given as
Responses items renders the same prompt as the same conversation given to /v1/chat/completions.

Items taken: messages (role user / system / developer / assistant; content a string or parts ``input_text``,
``input_image``, ``output_text``, ``refusal``), ``function_call`` (an assistant turn's tool call, by its
``call_id``), ``function_call_output`` (the tool's answer) and ``reasoning`` (taken and not rendered: chat
templates drop past reasoning from the history, and nothing here produces reasoning yet). Consecutive
``function_call`` items join the assistant message before them, and an assistant message right after calls joins
them, as one chat message carries a turn's text and calls."""
from __future__ import annotations

import json
from typing import Any

from mindie_service.errors import ValidationError, check

MAX_ITEMS = 512
_ROLES = ("user", "system", "developer", "assistant")
_MESSAGE_KEYS = {"type", "role", "content", "id", "status", "phase"}
_CALL_KEYS = {"type", "call_id", "name", "arguments", "id", "status", "namespace"}
_OUTPUT_KEYS = {"type", "call_id", "output", "id", "status", "name", "namespace"}
_REASONING_KEYS = {"type", "id", "summary", "content", "encrypted_content", "status"}


def _no_extra(item: dict[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(item) - allowed)
    if extra:
        raise ValidationError(f"Parameter {where}.{extra[0]} is not supported on this item "
                              f"(it takes {', '.join(sorted(allowed))})")


def _part(part: Any, where: str, role: str) -> Any:
    """One content part -> chat's part (a text string, or an image_url part)."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text", "text"):
        check(isinstance(part.get("text"), str), f"{where}.text", "a string", part.get("text"))
        return part["text"]
    if kind == "refusal":
        check(isinstance(part.get("refusal"), str), f"{where}.refusal", "a string", part.get("refusal"))
        return part["refusal"]
    if kind == "input_image":
        check(role == "user", f"{where}.type", "text in a non-user message", kind)
        check(part.get("file_id") is None, f"{where}.file_id", "absent (there is no Files API here; send image_url)",
              part.get("file_id"))
        check(part.get("detail") in (None, "auto", "low", "high"), f"{where}.detail", "auto, low or high",
              part.get("detail"))
        url = part.get("image_url")
        check(isinstance(url, str) and url.strip() != "", f"{where}.image_url", "a data: URI or an http(s) URL", url)
        return {"type": "image_url", "image_url": {"url": url}}
    raise ValidationError(f"Parameter {where}.type must be one of input_text, input_image, output_text, refusal, "
                          f"got {kind!r}")


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    _no_extra(item, _MESSAGE_KEYS, where)
    role = item.get("role")
    check(role in _ROLES, f"{where}.role", "one of user, system, developer, assistant", role)
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    check(isinstance(content, list), f"{where}.content", "a string or a list of content parts", content)
    parts = [_part(p, f"{where}.content[{j}]", role) for j, p in enumerate(content)]
    if all(isinstance(p, str) for p in parts):  # text only: one string, as a chat client sends it
        return {"role": role, "content": "".join(parts)}
    return {"role": role, "content": [{"type": "text", "text": p} if isinstance(p, str) else p for p in parts]}


def _call(item: dict[str, Any], where: str) -> dict[str, Any]:
    _no_extra(item, _CALL_KEYS, where)
    for key in ("call_id", "name", "arguments"):
        check(isinstance(item.get(key), str) and (key == "arguments" or item[key] != ""), f"{where}.{key}",
              "a string" if key == "arguments" else "a non-empty string", item.get(key))
    return {"id": item["call_id"], "type": "function", "function": {"name": item["name"],
                                                                     "arguments": item["arguments"]}}


def _output(item: dict[str, Any], where: str) -> dict[str, Any]:
    _no_extra(item, _OUTPUT_KEYS, where)
    check(isinstance(item.get("call_id"), str) and item["call_id"] != "", f"{where}.call_id",
          "the call_id of the function_call it answers", item.get("call_id"))
    out = item.get("output")
    if isinstance(out, list):  # a list of input_text parts
        out = "".join(_part(p, f"{where}.output[{j}]", "tool") for j, p in enumerate(out))
    elif not isinstance(out, str):
        out = json.dumps(out, ensure_ascii=False)
    return {"role": "tool", "tool_call_id": item["call_id"], "content": out}


def to_messages(items: list[Any], where: str = "input") -> list[dict[str, Any]]:
    """Chat messages for ``items`` (Responses input items); ValidationError naming the item's field."""
    check(len(items) <= MAX_ITEMS, where, f"at most {MAX_ITEMS} items", len(items))
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        check(isinstance(item, dict), at, "an object (a message or an item)", item)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            msg, last = _message(item, at), out[-1] if out else None
            if (msg["role"] == "assistant" and isinstance(msg["content"], str) and last is not None
                    and last["role"] == "assistant" and last.get("tool_calls")):
                last["content"] = (last["content"] or "") + msg["content"]  # one assistant turn, as chat has it
            else:
                out.append(msg)
        elif kind == "function_call":
            call = _call(item, at)
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append(_output(item, at))
        elif kind == "reasoning":
            _no_extra(item, _REASONING_KEYS, at)  # taken, not rendered (module doc)
        else:
            raise ValidationError(f"Parameter {at}.type must be one of message, function_call, "
                                  f"function_call_output, reasoning, got {kind!r}")
    return out


def input_items(value: Any) -> list[dict[str, Any]]:
    """``input`` as a list of items (a string is one user message), each as the client wrote it."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    check(isinstance(value, list), "input", "a string or a list of items", value)
    return [dict(v) if isinstance(v, dict) else v for v in value]


def stored_items(items: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    """``items`` as the store keeps them and ``input_items`` lists them: each with an id (``<prefix><n>`` where
    the client gave none), a message's string content as one ``input_text`` part."""
    out = []
    for n, item in enumerate(items):
        it = dict(item)
        kind = it.setdefault("type", "message")
        if kind == "message":
            text_type = "output_text" if it.get("role") == "assistant" else "input_text"
            if isinstance(it.get("content"), str):
                it["content"] = [{"type": text_type, "text": it["content"]}]
            it.setdefault("status", "completed")
        if not it.get("id"):
            it["id"] = f"{'msg' if kind == 'message' else kind[:2]}_{prefix}{n:03d}"
        out.append(it)
    return out

"""Tool calls in OpenAI's chat responses: ``message.tool_calls`` (id, type, function.name, function.arguments
as a JSON string) and, streamed, ``delta.tool_calls`` (index, then id, type and name first, then argument
fragments). Both come from one ``ToolCallParser`` fed the same text (the whole of it, or each delta), so the
stream assembles to the non-streamed answer.

finish_reason: ``tool_calls`` when the model called (OpenAI's), ``stop`` for a forced named function (OpenAI
answers a named ``tool_choice`` with ``stop``), ``length`` when the cap came first (the call may be cut)."""
from __future__ import annotations

from typing import Any

from mindie_service.protocol.tool_calls import ToolsRequest
from mindie_service.protocol.tool_parser import ToolCallDelta, ToolCallParser


def parser_for(tools: ToolsRequest | None, request_id: str, choice: int) -> ToolCallParser | None:
    """The choice's parser; None when the request allows no call (no tools, or tool_choice none)."""
    if tools is None or not tools.active:
        return None
    return ToolCallParser(tools.fmt, id_prefix=f"call_{request_id[-12:]}{choice}_")


def finish(tools: ToolsRequest, parser: ToolCallParser, reason: str | None) -> str | None:
    if reason is None or reason == "length" or not parser.calls:
        return reason
    return "stop" if tools.named else "tool_calls"


def message(tools: ToolsRequest | None, request_id: str, choice: int, text: str,
            reason: str | None) -> tuple[dict[str, Any], str | None]:
    """The non-streamed ``message`` and finish reason (OpenAI's words in ``reason``)."""
    p = parser_for(tools, request_id, choice)
    if p is None:
        return {"role": "assistant", "content": text}, reason
    p.feed(text, final=True)
    msg: dict[str, Any] = {"role": "assistant", "content": p.content if p.content or not p.calls else None}
    if p.calls:
        msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                             for c in p.calls]
    assert tools is not None
    return msg, finish(tools, p, reason)


def _delta_json(d: ToolCallDelta) -> dict[str, Any]:
    if d.id is not None:
        return {"index": d.index, "id": d.id, "type": "function", "function": {"name": d.name, "arguments": ""}}
    return {"index": d.index, "function": {"arguments": d.arguments}}


def stream_delta(tools: ToolsRequest, parser: ToolCallParser, text: str,
                 reason: str | None) -> tuple[dict[str, Any], str | None]:
    """One stream frame's ``delta`` for ``text`` (the event's text delta) and its finish reason."""
    content, deltas = parser.feed(text, final=reason is not None)
    delta: dict[str, Any] = {}
    if content:
        delta["content"] = content
    if deltas:
        delta["tool_calls"] = [_delta_json(d) for d in deltas]
    return delta, finish(tools, parser, reason)

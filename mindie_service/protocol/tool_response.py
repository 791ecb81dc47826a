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
    assert tools is not None
    msg: dict[str, Any] = {"role": "assistant", "content": p.content if p.content or not p.calls else None}
    if p.calls and tools.legacy:  # the legacy functions form: one call, message.function_call
        c = p.calls[0]
        msg["function_call"] = {"name": c.name, "arguments": c.arguments}
        fr = finish(tools, p, reason)
        return msg, "function_call" if fr == "tool_calls" else fr
    if p.calls:
        msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                             for c in p.calls]
    return msg, finish(tools, p, reason)


def merged(deltas: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """One delta per call index, in order (a call's header and its first argument bytes, found in one feed, are
    one entry: OpenAI sends at most one entry per index in a chunk, and clients read ``tool_calls[0]``)."""
    out: list[ToolCallDelta] = []
    for d in deltas:
        if out and out[-1].index == d.index:
            last = out[-1]
            out[-1] = ToolCallDelta(d.index, last.id or d.id, last.name or d.name, last.arguments + d.arguments)
        else:
            out.append(d)
    return out


def _delta_json(d: ToolCallDelta) -> dict[str, Any]:
    if d.id is not None:
        return {"index": d.index, "id": d.id, "type": "function",
                "function": {"name": d.name, "arguments": d.arguments}}
    return {"index": d.index, "function": {"arguments": d.arguments}}


def stream_delta(tools: ToolsRequest, parser: ToolCallParser, text: str,
                 reason: str | None) -> tuple[dict[str, Any], str | None]:
    """One stream frame's ``delta`` for ``text`` (the event's text delta) and its finish reason."""
    content, deltas = parser.feed(text, final=reason is not None)
    delta: dict[str, Any] = {}
    if content:
        delta["content"] = content
    fr = finish(tools, parser, reason)
    if tools.legacy:  # one call: delta.function_call (name first, then argument fragments)
        deltas = [d for d in merged(deltas) if d.index == 0]
        if deltas:
            d = deltas[0]
            delta["function_call"] = ({"name": d.name, "arguments": d.arguments} if d.id is not None
                                      else {"arguments": d.arguments})
        return delta, "function_call" if fr == "tool_calls" else fr
    if deltas:
        delta["tool_calls"] = [_delta_json(d) for d in merged(deltas)]
    return delta, fr

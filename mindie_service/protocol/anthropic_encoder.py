"""Anthropic's response shapes for /v1/messages: the Message body, the stream's events (``message_start``,
``ping``, ``content_block_start`` / ``content_block_delta`` (``thinking_delta``, ``text_delta``,
``input_json_delta``) /
``content_block_stop``, ``message_delta`` with stop_reason and usage, ``message_stop``, and ``error``), and the
error body ``{"type": "error", "error": {"type", "message"}}``.

Content blocks come from one ``BlockBuilder`` fed the tool-call parser's ordered output (text pieces and call
deltas as the text holds them): the stream feeds it each event's text, the whole answer feeds it the whole text
once, so both give the same blocks (thinking, text, tool_use, text ...). The thinking (engine.output.reasoning's
split) is one ``thinking`` block first, its ``signature`` empty (nothing here signs thinking). An
``input_json_delta`` never ends inside an escape sequence (``\\`` or ``\\u12``) or between the halves of a
surrogate pair: that tail waits for the next."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from mindie_service.engine.contract import FINISH_LENGTH, FINISH_STOP, TokenEvent
from mindie_service.errors import MindieError
from mindie_service.protocol.anthropic_fields import AnthropicRequest
from mindie_service.protocol.encoders import Encoder, StreamState, sse
from mindie_service.protocol.request import GenerationRequest, GenerationResult
from mindie_service.protocol.tool_parser import ToolCallDelta, ToolCallParser

# status -> Anthropic's error type (any other 4xx: invalid_request_error; 5xx: api_error)
_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 413: "request_too_large",
          424: "api_error", 429: "rate_limit_error", 503: "overloaded_error"}


def anthropic_error(err: MindieError) -> tuple[int, dict[str, Any]]:
    """(status, body): a bad value is Anthropic's 400 (our 422); every other status stays."""
    status = 400 if err.status == 422 else err.status
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return status, {"type": "error", "error": {"type": kind, "message": err.message}}


_HIGH = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}$")


def json_cut(text: str) -> int:
    """How much of ``text`` (partial JSON) may be sent: all but a trailing escape sequence that is not complete
    (``\\`` or ``\\u12``), and a high surrogate's escape still waiting for its low half."""
    i = text.rfind("\\")
    if i < 0:
        return len(text)
    run = i - len(text[:i].rstrip("\\")) + 1  # backslashes ending at i
    if run % 2 == 0:
        return len(text)  # an escaped backslash: complete
    rest = text[i + 1:]
    if rest and (rest[0] != "u" or len(rest) >= 5):  # \n, \" ... or a whole \uXXXX
        return i if _HIGH.search(text) and len(rest) == 5 else len(text)
    return i - 6 if _HIGH.search(text[:i]) else i  # incomplete: held (with a high surrogate before it)


def stop_reason(req: AnthropicRequest, r: GenerationResult, called: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): max_tokens when the cap came first, tool_use after a call, stop_sequence
    naming the client's sequence the text stopped at (the tokens' text goes on with it past the trimmed text),
    else end_turn (EOS, the model's own stop tokens)."""
    if r.finish_reason == FINISH_LENGTH:
        return "max_tokens", None
    if called:
        return "tool_use", None
    if r.finish_reason == FINISH_STOP and req.stop_sequences:
        tail = "".join(t.text for t in r.tokens)[len(r.text):]
        hit = next((s for s in req.stop_sequences if tail.startswith(s)), None)
        if hit is not None:
            return "stop_sequence", hit
    return "end_turn", None


@dataclass
class BlockBuilder:
    """Content blocks, built from the parser's ordered output; each step's events too (for the stream)."""

    parser: ToolCallParser | None
    blocks: list[dict[str, Any]] = field(default_factory=list)
    open: bool = False
    held: str = ""  # input JSON waiting for the rest of an escape sequence
    args: str = ""  # the open tool block's whole input JSON

    def feed(self, text: str, final: bool) -> list[tuple[str, dict[str, Any]]]:
        items: list[Any] = (self.parser.feed_ordered(text, final) if self.parser is not None
                            else [text] if text else [])
        events: list[tuple[str, dict[str, Any]]] = []
        for it in items:
            if isinstance(it, str):
                self._text(it, events)
            else:
                self._call(it, events)
        if final:
            self._close(events)
        return events

    def think(self, text: str) -> list[tuple[str, dict[str, Any]]]:
        """Thinking text: the thinking block's (opened at its first text)."""
        events: list[tuple[str, dict[str, Any]]] = []
        if not text:
            return events
        if not (self.open and self.blocks[-1]["type"] == "thinking"):
            self._start({"type": "thinking", "thinking": "", "signature": ""}, events)
        self.blocks[-1]["thinking"] += text
        events.append(("content_block_delta", {"index": len(self.blocks) - 1,
                                               "delta": {"type": "thinking_delta", "thinking": text}}))
        return events

    def _start(self, block: dict[str, Any], events: list[tuple[str, dict[str, Any]]]) -> None:
        self._close(events)
        self.blocks.append(block)
        self.open = True
        events.append(("content_block_start", {"index": len(self.blocks) - 1, "content_block": dict(block)}))

    def _text(self, text: str, events: list[tuple[str, dict[str, Any]]]) -> None:
        if not (self.open and self.blocks[-1]["type"] == "text"):
            self._start({"type": "text", "text": ""}, events)
        self.blocks[-1]["text"] += text
        events.append(("content_block_delta", {"index": len(self.blocks) - 1,
                                               "delta": {"type": "text_delta", "text": text}}))

    def _call(self, d: ToolCallDelta, events: list[tuple[str, dict[str, Any]]]) -> None:
        if d.id is not None:
            self._start({"type": "tool_use", "id": d.id, "name": d.name, "input": {}}, events)
            self.args = ""
        self._json(d.arguments, events, flush=False)

    def _json(self, piece: str, events: list[tuple[str, dict[str, Any]]], flush: bool) -> None:
        text = self.held + piece
        cut = len(text) if flush else json_cut(text)
        self.held = text[cut:]
        if cut:
            self.args += text[:cut]
            events.append(("content_block_delta", {"index": len(self.blocks) - 1,
                                                   "delta": {"type": "input_json_delta", "partial_json": text[:cut]}}))

    def _close(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        if not self.open:
            return
        block = self.blocks[-1]
        if block["type"] == "tool_use":
            self._json("", events, flush=True)
            try:
                block["input"] = json.loads(self.args) if self.args else {}
            except ValueError:
                block["input"] = {}  # a call the cap cut short: its input is not an object yet
        events.append(("content_block_stop", {"index": len(self.blocks) - 1}))
        self.open = False

    @property
    def called(self) -> bool:
        return any(b["type"] == "tool_use" for b in self.blocks)


def _builder(req: AnthropicRequest) -> BlockBuilder:
    tools = req.tools
    if tools is None or not tools.active:
        return BlockBuilder(None)
    return BlockBuilder(ToolCallParser(tools.fmt, id_prefix=f"toolu_{req.request_id[-12:].replace('-', '')}_"))


def _event(name: str, body: dict[str, Any]) -> bytes:
    return sse({"type": name, **body}, prefix=f"event: {name}\ndata: ")


class AnthropicEncoder(Encoder):
    """One instance per process; a request is one sample (Messages has no n)."""

    @staticmethod
    def _message(req: AnthropicRequest, content: list[dict[str, Any]], reason: tuple[str | None, str | None],
                 usage: dict[str, int]) -> dict[str, Any]:
        return {"id": f"msg_{req.request_id}", "type": "message", "role": "assistant", "model": req.model,
                "content": content, "stop_reason": reason[0], "stop_sequence": reason[1], "usage": usage}

    def complete(self, req: GenerationRequest, results: list[GenerationResult]) -> Any:
        assert isinstance(req, AnthropicRequest)
        (r,) = results
        b = _builder(req)
        b.think(r.reasoning)
        b.feed(r.text, final=True)
        return self._message(req, b.blocks, stop_reason(req, r, b.called),
                             {"input_tokens": r.num_prompt_tokens, "output_tokens": len(r.tokens)})

    def stream_frame(self, req: GenerationRequest, ev: TokenEvent, result: GenerationResult,
                     state: StreamState) -> bytes:
        assert isinstance(req, AnthropicRequest)
        out = b""
        if state.count == 0:
            state.dialect = _builder(req)
            usage = {"input_tokens": result.num_prompt_tokens, "output_tokens": 0}
            out = _event("message_start", {"message": self._message(req, [], (None, None), usage)})
            out += _event("ping", {})
        state.count += 1
        b: BlockBuilder = state.dialect
        final = ev.finish_reason is not None
        out += b"".join(_event(name, body) for name, body in b.think(ev.reasoning_delta) + b.feed(ev.text_delta, final))
        if final:
            reason, seq = stop_reason(req, result, b.called)
            out += _event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": seq},
                                            "usage": {"output_tokens": len(result.tokens)}})
            out += _event("message_stop", {})
        return out

    def stream_error(self, err: MindieError) -> bytes:
        return _event("error", {"error": anthropic_error(err)[1]["error"]})

    def error_json(self, err: MindieError) -> dict[str, Any]:
        return anthropic_error(err)[1]


_TEXT_OR_BLOCKS = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]}
_MESSAGES = {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["role", "content"],
                                                       "properties": {"role": {"enum": ["user", "assistant"]},
                                                                      "content": _TEXT_OR_BLOCKS}}}
# The routes' schemas in /openapi.json (server/openapi.py).
OPENAPI_SCHEMAS: dict[str, Any] = {
    "MessagesRequest": {"type": "object", "required": ["model", "messages", "max_tokens"], "properties": {
        "model": {"type": "string"}, "messages": _MESSAGES, "system": _TEXT_OR_BLOCKS,
        "max_tokens": {"type": "integer", "minimum": 1}, "stop_sequences": {"type": "array", "items": {
            "type": "string"}}, "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}, "top_k": {"type": "integer", "minimum": 0},
        "stream": {"type": "boolean"}, "tools": {"type": "array", "items": {"type": "object", "required": ["name"]}},
        "tool_choice": {"type": "object", "required": ["type"]},
        "thinking": {"type": "object", "required": ["type"], "properties": {
            "type": {"enum": ["enabled", "disabled"]}, "budget_tokens": {"type": "integer", "minimum": 1}}},
        "metadata": {"type": "object", "properties": {"user_id": {"type": "string"}}}},
        "description": "Anthropic's Messages request (temperature, top_p, top_k from the body: the 2.x SDK's "
                       "extra_body)."},
    "Message": {"type": "object", "required": ["id", "type", "role", "content", "model", "stop_reason", "usage"],
                "properties": {"id": {"type": "string"}, "type": {"const": "message"},
                               "role": {"const": "assistant"}, "content": {"type": "array"},
                               "model": {"type": "string"}, "stop_reason": {"type": ["string", "null"]},
                               "stop_sequence": {"type": ["string", "null"]}, "usage": {
                                   "type": "object", "required": ["input_tokens", "output_tokens"]}},
                "description": "Non-stream body; with stream: true, Anthropic's text/event-stream events."},
    "CountTokensRequest": {"type": "object", "required": ["model", "messages"], "properties": {
        "model": {"type": "string"}, "messages": _MESSAGES, "system": _TEXT_OR_BLOCKS,
        "tools": {"type": "array", "items": {"type": "object"}}}},
    "CountTokensResponse": {"type": "object", "required": ["input_tokens"],
                            "properties": {"input_tokens": {"type": "integer"}}},
    "AnthropicError": {"type": "object", "required": ["type", "error"], "properties": {
        "type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"], "properties": {
            "type": {"type": "string"}, "message": {"type": "string"}}}},
        "description": "Messages routes: Anthropic's error object."},
}
OPENAPI_SHAPES: dict[str, dict[str, tuple[str | None, str | None]]] = {
    "/v1/messages": {"post": ("MessagesRequest", "Message")},
    "/v1/messages/count_tokens": {"post": ("CountTokensRequest", "CountTokensResponse")},
}

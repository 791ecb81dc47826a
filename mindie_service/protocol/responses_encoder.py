"""The Responses API's response object, its lifecycle events and its SSE framing.

A response is ``queued`` (background, not started), ``in_progress``, then ``completed``, ``incomplete``
(the output cap: ``incomplete_details.reason = "max_output_tokens"``), ``failed`` (``error``) or ``cancelled``.
Stream frames are ``event: <type>`` + ``data: <json>`` as OpenAI sends them; there is no ``[DONE]``."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from mindie_service.errors import MindieError
from mindie_service.protocol.openai_encoder import obfuscation, openai_error
from mindie_service.protocol.responses_request import ResponsesRequest

TERMINAL = frozenset({"completed", "incomplete", "failed", "cancelled"})
FINAL_EVENTS = {"completed": "response.completed", "incomplete": "response.incomplete",
                "failed": "response.failed"}


@dataclass
class Usage:
    """Token counts of a response (``cached``: prompt tokens the prefix cache served)."""

    input: int = 0
    cached: int = 0
    output: int = 0
    reasoning: int = 0  # of the output's, thinking (a reasoning split)

    def json(self) -> dict[str, Any]:
        return {"input_tokens": self.input,
                "input_tokens_details": {"cached_tokens": self.cached, "cache_write_tokens": 0},
                "output_tokens": self.output, "output_tokens_details": {"reasoning_tokens": self.reasoning},
                "total_tokens": self.input + self.output}


@dataclass
class ResponseState:
    """What the response object says at one moment."""

    id: str
    req: ResponsesRequest
    created_at: float = field(default_factory=time.time)
    status: str = "in_progress"
    output: list[dict[str, Any]] = field(default_factory=list)
    usage: Usage | None = None
    error: dict[str, Any] | None = None
    completed_at: float | None = None

    def json(self) -> dict[str, Any]:
        o, chat = self.req.options, self.req.chat
        return {
            "id": self.id, "object": "response", "created_at": int(self.created_at), "status": self.status,
            "background": o.background, "error": self.error,
            "incomplete_details": {"reason": "max_output_tokens"} if self.status == "incomplete" else None,
            "instructions": o.instructions, "max_output_tokens": o.max_output_tokens, "max_tool_calls": None,
            "metadata": o.metadata, "model": chat.model, "output": self.output,
            "parallel_tool_calls": chat.tools.parallel if chat.tools is not None else True,
            "previous_response_id": o.previous_response_id, "reasoning": {"effort": o.reasoning_effort, "summary": None},
            "service_tier": "default", "store": o.store,
            "temperature": 1.0 if o.temperature is None else o.temperature,
            "text": {"format": o.text_format, "verbosity": "medium"}, "tool_choice": o.tool_choice,
            "tools": [_tool_json(t) for t in o.tools], "top_logprobs": o.top_logprobs or 0,
            "top_p": 1.0 if o.top_p is None else o.top_p, "truncation": o.truncation,
            "usage": self.usage.json() if self.usage is not None else None, "user": o.user,
            "completed_at": None if self.completed_at is None else int(self.completed_at),
        }


def _tool_json(t: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "name": t.get("name"), "description": t.get("description"),
            "parameters": t.get("parameters"), "strict": t.get("strict", True)}


def error_body(err: MindieError) -> tuple[int, dict[str, Any]]:
    """(status, OpenAI's error body)."""
    return openai_error(err)


def error_event(err: MindieError, seq: int) -> dict[str, Any]:
    """The stream's ``error`` event."""
    e = openai_error(err)[1]["error"]
    return {"type": "error", "sequence_number": seq, "code": e["code"], "message": e["message"], "param": e["param"]}


def failed_error(err: MindieError) -> dict[str, Any]:
    """A failed response's ``error`` field: ``{code, message}``."""
    return {"code": "server_error" if err.status >= 500 else "invalid_prompt", "message": err.message}


def frame(event: dict[str, Any], obfuscate: bool = False) -> bytes:
    """One SSE frame: ``event: <type>`` and ``data: <json>``. ``obfuscate`` (stream_options.include_obfuscation)
    adds OpenAI's ``obfuscation`` padding to a delta event, per transmission: a stored event never has it."""
    if obfuscate and event["type"].endswith(".delta"):
        event = {**event, "obfuscation": obfuscation()}
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return f"event: {event['type']}\ndata: {data}\n\n".encode()

"""A streamed chat with tools holds back text that may be the start of a call marker (``<tool`` could become
``<tool_call>``); the stream's last frame (the one carrying finish_reason) flushes what was held, so a reply
ending on a marker prefix streams its whole content, as the non-streamed answer gives it. Through the OpenAI
encoder's stream frames (protocol.openai_encoder, protocol.tool_response), no engine."""
from __future__ import annotations

import json

import pytest

from mindie_service.engine.contract import TokenEvent, TokenInfo
from mindie_service.protocol import tool_response
from mindie_service.protocol.encoders import StreamState
from mindie_service.protocol.openai import parse_openai
from mindie_service.protocol.openai_encoder import OpenAIEncoder
from mindie_service.protocol.request import GenerationResult, ProtocolLimits
from mindie_service.structured.tool_formats import FORMATS

TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}]


def _request(fmt: str):
    body = {"model": "m", "stream": True, "tools": TOOLS, "messages": [{"role": "user", "content": "hi"}]}
    return parse_openai(body, "chat", limits=ProtocolLimits(vocab_size=100), model="m",
                        request_id="chatcmpl-1", tool_format=FORMATS[fmt])


def _events(pieces: list[str], finish: str) -> list[TokenEvent]:
    out = []
    for i, text in enumerate(pieces):
        ev = TokenEvent("chatcmpl-1", TokenInfo(10 + i, None, text, False), text, i)
        if i == 0:
            ev.num_prompt_tokens = 3
        if i == len(pieces) - 1:
            ev.finish_reason, ev.full_text = finish, "".join(pieces)
        out.append(ev)
    return out


def _stream(fmt: str, pieces: list[str], finish: str = "length") -> tuple[str, list[str | None]]:
    """The content a client assembles from the stream's frames, and each frame's finish_reason."""
    req, enc = _request(fmt), OpenAIEncoder()
    acc, state = GenerationResult(), StreamState()
    content, reasons = "", []
    for ev in _events(pieces, finish):
        acc.add(ev)
        raw = enc.stream_frame(req, ev, acc, state).decode()
        if not raw:  # a marker held back whole: no frame (never an empty delta)
            reasons.append(None)
            continue
        (choice,) = json.loads(raw[len("data: "):])["choices"]
        assert choice["delta"] or choice["finish_reason"] is not None, raw
        assert "tool_calls" not in choice["delta"]
        content += choice["delta"].get("content", "")
        reasons.append(choice["finish_reason"])
    return content, reasons


# each reply ends on a prefix of its format's marker: held back until the last frame
@pytest.mark.parametrize("fmt,pieces", [("hermes", ["The answer", " is 4. ", "<tool"]),
                                        ("hermes", ["Done", "<"]),
                                        ("mistral", ["ok ", "[TOOL_"]),
                                        ("llama3_json", ["see ", "<|python"])])
@pytest.mark.parametrize("finish", ["length", "stop"])
def test_the_last_frame_flushes_a_held_marker_prefix(fmt, pieces, finish):
    content, reasons = _stream(fmt, pieces, finish)
    assert content == "".join(pieces)
    assert reasons[:-1] == [None] * (len(pieces) - 1) and reasons[-1] == finish
    msg, _ = tool_response.message(_request(fmt).tools, "chatcmpl-1", 0, "".join(pieces), finish)
    assert msg["content"] == content  # the non-streamed answer says the same


def test_a_marker_prefix_is_held_until_the_text_decides():
    content, _ = _stream("hermes", ["a <tool", "box> b"])  # not a marker after all: sent once it is known
    assert content == "a <toolbox> b"
    req = _request("hermes")
    parser = tool_response.parser_for(req.tools, "chatcmpl-1", 0)
    assert parser is not None
    first, _ = tool_response.stream_delta(req.tools, parser, "a <tool", None)
    assert first == {"content": "a "}  # "<tool" held: it may begin "<tool_call>"
    last, reason = tool_response.stream_delta(req.tools, parser, "", "stop")
    assert last == {"content": "<tool"} and reason == "stop"

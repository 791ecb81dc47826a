"""Anthropic's Messages API (protocol/anthropic_fields.py, anthropic_encoder.py, server/handlers_anthropic.py):
a conversation becomes the chat route's neutral request (the same messages, tools and sampling); streamed
content blocks assemble to the whole answer under any chunking; ``input_json_delta`` never ends inside an escape;
errors in Anthropic's shape; ``x-api-key``; count_tokens."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from mindie_service.engine.contract import TokenEvent, TokenInfo
from mindie_service.errors import ValidationError
from mindie_service.protocol.anthropic_encoder import AnthropicEncoder, anthropic_error, json_cut
from mindie_service.protocol.anthropic_fields import parse_messages
from mindie_service.protocol.encoders import StreamState
from mindie_service.protocol.openai import parse_openai
from mindie_service.protocol.request import GenerationResult, ProtocolLimits
from mindie_service.errors import OverloadedError, UnhealthyError
from mindie_service.structured.tool_formats import FORMATS
from multimodal import MediaItem, MediaPolicy
from tests.inprocess import InProcessServer

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def _msg(body: dict, fmt: str = "hermes"):
    return parse_messages({"model": "m", "max_tokens": 16, **body}, model="m", policy=MediaPolicy(), vocab_size=100,
                          request_id="r1", tool_format=FORMATS[fmt])


def _chat(body: dict, fmt: str = "hermes"):
    return parse_openai({"model": "m", "max_tokens": 16, **body}, "chat",
                        limits=ProtocolLimits(vocab_size=100), model="m", request_id="r1", tool_format=FORMATS[fmt])


def test_a_conversation_is_the_chat_routes_neutral_request():
    a = _msg({"system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
              "temperature": 0, "stop_sequences": ["\n\n"],
              "tools": [{"name": "weather", "description": "Weather", "input_schema": WEATHER}],
              "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
              "messages": [{"role": "user", "content": "Paris?"},
                           {"role": "assistant", "content": [
                               {"type": "text", "text": "Let me look."},
                               {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Paris"}}]},
                           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sun"},
                                                        {"type": "text", "text": "And so?"}]}]})
    c = _chat({"temperature": 0, "stop": ["\n\n"], "tool_choice": "required", "parallel_tool_calls": False,
               "tools": [{"type": "function", "function": {"name": "weather", "description": "Weather",
                                                           "parameters": WEATHER}}],
               "messages": [{"role": "system", "content": [{"type": "text", "text": "Be brief."},
                                                           {"type": "text", "text": "Be kind."}]},
                            {"role": "user", "content": "Paris?"},
                            {"role": "assistant", "content": "Let me look.", "tool_calls": [
                                {"id": "t1", "type": "function",
                                 "function": {"name": "weather", "arguments": '{"city":"Paris"}'}}]},
                            {"role": "tool", "tool_call_id": "t1", "content": "sun"},
                            {"role": "user", "content": [{"type": "text", "text": "And so?"}]}]})
    assert a.prompt == c.prompt and a.params == c.params and a.tools == c.tools


def test_tool_choices_and_images_map():
    t = [{"name": "w", "input_schema": WEATHER}]
    assert _msg({"tools": t, "messages": [{"role": "user", "content": "x"}]}).tools.choice == "auto"
    assert _msg({"tools": t, "tool_choice": {"type": "tool", "name": "w"},
                 "messages": [{"role": "user", "content": "x"}]}).tools.choice == "w"
    none = _msg({"tools": t, "tool_choice": {"type": "none"}, "messages": [{"role": "user", "content": "x"}]})
    assert none.params.structured_outputs is None and none.prompt.tools == ()
    img = _msg({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
        {"type": "text", "text": "what?"}]}]})
    parts = img.prompt.messages[0].content
    assert parts[0] == MediaItem(0, "image", "data:image/png;base64,iVBORw0KGgo=")
    assert parts[1] == MediaItem(1, "image", "https://example.com/a.png") and parts[2] == "what?"


@pytest.mark.parametrize("body,field", [
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ({"max_tokens": None}, "max_tokens"),
    ({"temperature": 1.5}, "temperature"),
    ({"container": "x"}, "container"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}, "messages[1].role"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
    ({"tools": [{"name": "w", "input_schema": {"properties": {"a": {"$ref": "#/$defs/X"}}}}]},
     "tools[0].input_schema"),
    ({"messages": [{"role": "assistant", "content": [{"type": "document", "source": {}}]},
                   {"role": "user", "content": "x"}]}, "messages[0].content[0].type"),
    ({"thinking": {"type": "adaptive"}}, "thinking"),
])
def test_what_cannot_be_honoured_is_refused_by_name(body, field):
    body = {"messages": [{"role": "user", "content": "x"}], **body}
    if body.get("max_tokens", 1) is None:
        body = {k: v for k, v in body.items() if k != "max_tokens"}
        with pytest.raises(ValidationError, match=f"^Parameter {field} "):
            parse_messages({"model": "m", **body}, model="m", policy=MediaPolicy(), vocab_size=100)
        return
    with pytest.raises(ValidationError, match=f"^Parameter {field.replace('[', '.').replace(']', '.')}"):
        _msg(body)


def _stream_blocks(req, text: str, cuts: list[int], finish: str = "stop") -> tuple[list[dict], list[str], dict]:
    """Feed ``text`` cut at ``cuts`` through the stream; assemble blocks as a client does."""
    enc, acc, state = AnthropicEncoder(), GenerationResult(), StreamState()
    bounds = sorted({0, len(text), *[c for c in cuts if 0 < c < len(text)]})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])] + [""]
    blocks, partials, events = [], [], []
    for i, piece in enumerate(pieces):
        ev = TokenEvent("r", TokenInfo(i, None, piece, False), piece, i, num_prompt_tokens=4 if i == 0 else 0)
        if i == len(pieces) - 1:
            ev.finish_reason, ev.full_text = finish, text
        acc.add(ev)
        for frame in enc.stream_frame(req, ev, acc, state).decode().split("\n\n")[:-1]:
            name, data = frame.split("\n")
            obj = json.loads(data[len("data: "):])
            assert name == f"event: {obj['type']}"
            events.append(obj)
    for e in events:
        if e["type"] == "content_block_start":
            blocks.append(dict(e["content_block"], _json=""))
        elif e["type"] == "content_block_delta":
            b, d = blocks[e["index"]], e["delta"]
            if d["type"] == "text_delta":
                b["text"] += d["text"]
            else:
                partials.append(d["partial_json"])
                b["_json"] += d["partial_json"]
    for b in blocks:
        js = b.pop("_json")
        if b["type"] == "tool_use":
            b["input"] = json.loads(js) if js else {}
    return blocks, partials, {"events": events, "result": acc}


TEXTS = st.lists(st.sampled_from(["<tool_call>", "\n", '{"name":"w","arguments":{"city":"P\\u00e9\\ud83d\\ude00"}}',
                                  "</tool_call>", "hi ", '{"name":"w","arguments":{"city":"a\\\\\\"b"}}', "<tool",
                                  "ok", " "]), max_size=10).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=TEXTS, cuts=st.lists(st.integers(0, 300), max_size=16))
def test_streamed_blocks_are_the_whole_answer_under_any_chunking(text, cuts):
    req = _msg({"tools": [{"name": "w", "input_schema": WEATHER}], "stream": True,
                "messages": [{"role": "user", "content": "x"}]})
    blocks, partials, got = _stream_blocks(req, text, cuts)
    whole = AnthropicEncoder().complete(req, [got["result"]])
    assert blocks == whole["content"]
    assert got["events"][-2]["delta"]["stop_reason"] == whole["stop_reason"]
    assert whole["stop_reason"] == ("tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn")
    for p in partials:  # never a partial escape sequence nor half a surrogate pair
        assert json_cut(p) == len(p), p


def test_stop_reasons_and_the_stop_sequence():
    req = _msg({"stop_sequences": ["END", "##"], "messages": [{"role": "user", "content": "x"}]})
    r = GenerationResult()
    for i, t in enumerate(["ab", "c#", "#x"]):
        r.add(TokenEvent("r", TokenInfo(i, None, t, False), t, i, num_prompt_tokens=2))
    r.finish_reason, r.full_text = "stop_sequence", "abc"
    body = AnthropicEncoder().complete(req, [r])
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", "##")
    assert body["content"] == [{"type": "text", "text": "abc"}] and body["usage"] == {"input_tokens": 2,
                                                                                      "output_tokens": 3}
    r.finish_reason = "length"
    assert AnthropicEncoder().complete(req, [r])["stop_reason"] == "max_tokens"
    r.finish_reason = "eos_token"
    assert AnthropicEncoder().complete(req, [r])["stop_reason"] == "end_turn"


def test_error_shapes():
    assert anthropic_error(ValidationError("Parameter x must be y")) == (
        400, {"type": "error", "error": {"type": "invalid_request_error", "message": "Parameter x must be y"}})
    assert anthropic_error(OverloadedError("busy"))[1]["error"]["type"] == "rate_limit_error"
    assert anthropic_error(UnhealthyError("down"))[1]["error"]["type"] == "overloaded_error"


class MessagesHttpTest(InProcessServer):
    server = {"businessApiKeys": ["sk-test-0123456789abcdef"]}

    def _post(self, path: str, body: dict, **headers: str):
        return self.fetch(path, method="POST", body=json.dumps(body),
                          headers={"Content-Type": "application/json", **headers})

    def test_x_api_key_and_the_answer_shapes(self) -> None:
        body = {"model": "mock", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
        r = self._post("/v1/messages", body)
        assert r.code == 401 and json.loads(r.body)["error"]["type"] == "authentication_error", r.body
        r = self._post("/v1/messages", body, **{"x-api-key": "sk-test-0123456789abcdef"})
        msg = json.loads(r.body)
        assert r.code == 200 and msg["type"] == "message" and msg["stop_reason"] == "max_tokens", r.body
        assert msg["usage"]["output_tokens"] == 3 and msg["content"][0]["type"] == "text"
        assert r.headers["request-id"] == r.headers["X-Request-Id"] and msg["id"] == "msg_" + r.headers["request-id"]
        r = self._post("/v1/messages", {**body, "model": "nope"}, **{"x-api-key": "sk-test-0123456789abcdef"})
        assert r.code == 404 and json.loads(r.body)["error"]["type"] == "not_found_error", r.body
        r = self._post("/v1/messages/count_tokens", {"model": "mock", "messages": body["messages"]},
                       Authorization="Bearer sk-test-0123456789abcdef")
        assert r.code == 200 and json.loads(r.body)["input_tokens"] > 0, r.body


JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["", "x", "auto", "user", "text",
                                                                                    "tool_use", "#/$defs/A"]),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                        st.sampled_from(["type", "name", "role", "content", "text", "id", "input", "tool_use_id",
                                         "source", "input_schema", "$ref", "user_id", "budget_tokens"]), inner,
                        max_size=4), max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(field=st.sampled_from(["system", "messages", "tools", "tool_choice", "metadata", "thinking", "stop_sequences",
                              "top_k", "service_tier"]), value=JSON)
def test_any_value_of_a_messages_field_is_taken_or_refused_by_name(field, value):
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}], field: value}
    try:
        parse_messages(body, model="m", policy=MediaPolicy(), vocab_size=100)
    except ValidationError as e:
        assert e.message.startswith("Parameter "), e.message


@settings(max_examples=400, deadline=None)
@given(field=st.sampled_from(["metadata", "store", "service_tier", "reasoning_effort", "prompt_cache_key",
                              "safety_identifier", "verbosity", "modalities", "prediction", "audio",
                              "web_search_options", "functions", "function_call", "stream_options", "response_format",
                              "messages"]), value=JSON)
def test_any_value_of_a_chat_client_field_is_taken_or_refused_by_name(field, value):
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}], field: value}
    try:
        _chat(body)
    except ValidationError as e:
        assert e.message.startswith("Parameter "), e.message

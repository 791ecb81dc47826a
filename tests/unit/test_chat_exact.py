"""The chat route as exact as OpenAI's where third-party clients found it was not (issue 45): one
``delta.tool_calls`` entry per index per chunk and no empty chunks while a marker is held; tools beside
response_format; tool schemas with ``$defs`` (pydantic's nested and recursive models) for every tool_choice, and
refusals that name the tool and the schema path; TGI's json_object + value; the client fields current clients
send; the legacy functions form; OpenAI's error shape under /v1/ and ``context_length_exceeded``."""
from __future__ import annotations

import json

import jsonschema
import pytest
from pydantic import BaseModel

from mindie_service.engine.contract import TokenEvent, TokenInfo
from mindie_service.errors import ContextLengthError, MethodNotAllowedError, ValidationError
from mindie_service.protocol import tool_response
from mindie_service.protocol.encoders import StreamState
from mindie_service.protocol.openai import parse_openai
from mindie_service.protocol.openai_encoder import OpenAIEncoder, openai_error
from mindie_service.protocol.request import GenerationResult, ProtocolLimits
from mindie_service.structured.tool_formats import FORMATS
from tests.inprocess import InProcessServer


class Address(BaseModel):
    city: str
    zip: int


class Person(BaseModel):
    name: str
    home: Address


class Node(BaseModel):
    value: int
    kids: list["Node"] = []


MSGS = [{"role": "user", "content": "hi"}]


def _tool(name: str, schema: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": schema}}


def _parse(**body):
    return parse_openai({"model": "m", "messages": MSGS, **body}, "chat",
                        limits=ProtocolLimits(vocab_size=100), model="m", request_id="chatcmpl-1",
                        tool_format=FORMATS["hermes"])


def _frames(req, pieces: list[str], finish: str = "stop") -> list[bytes]:
    enc, acc, state, out = OpenAIEncoder(), GenerationResult(), StreamState(), []
    for i, text in enumerate(pieces):
        ev = TokenEvent("c", TokenInfo(10 + i, None, text, False), text, i, num_prompt_tokens=3 if i == 0 else 0)
        if i == len(pieces) - 1:
            ev.finish_reason, ev.full_text = finish, "".join(pieces)
        acc.add(ev)
        out.append(enc.stream_frame(req, ev, acc, state))
    return out


def test_a_call_header_and_its_first_arguments_are_one_entry_and_held_markers_send_nothing():
    req = _parse(stream=True, tools=[_tool("f", {"type": "object", "properties": {"a": {"type": "integer"}}})])
    pieces = ["<", "tool", "_call", ">\n", '{"name":"f","arguments":{"a"', ':1}}', "\n</tool_call>"]
    frames = _frames(req, pieces)
    assert frames[:3] == [b"", b"", b""]  # the marker held: no chunk at all, never `delta: {}`
    calls: dict[int, dict] = {}
    for raw in filter(None, frames):
        (choice,) = json.loads(raw[len(b"data: "):])["choices"]
        assert choice["delta"] or choice["finish_reason"], raw
        entries = choice["delta"].get("tool_calls", [])
        assert len({e["index"] for e in entries}) == len(entries), entries  # one entry per index per chunk
        for e in entries:
            c = calls.setdefault(e["index"], {"name": None, "arguments": ""})
            c["name"] = e.get("function", {}).get("name") or c["name"]
            c["arguments"] += e["function"]["arguments"]
    assert calls == {0: {"name": "f", "arguments": '{"a":1}'}}
    first = json.loads(next(f for f in frames if f)[len(b"data: "):])["choices"][0]["delta"]["tool_calls"]
    assert first == [{"index": 0, "id": first[0]["id"], "type": "function",
                      "function": {"name": "f", "arguments": '{"a"'}}]  # header and `{"a"` in one entry


def test_a_whole_call_in_one_piece_is_one_entry():
    req = _parse(stream=True, tools=[_tool("f", {"type": "object"})])
    (raw,) = _frames(req, ['<tool_call>\n{"name":"f","arguments":{"x":[1]}}\n</tool_call>'])
    (entry,) = json.loads(raw[len(b"data: "):])["choices"][0]["delta"]["tool_calls"]
    assert entry["function"] == {"name": "f", "arguments": '{"x":[1]}'}


def test_tools_with_response_format_is_one_grammar():
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}}}
    for choice in ("auto", "required", {"type": "function", "function": {"name": "f"}}):
        req = _parse(tools=[_tool("f", {"type": "object"})], tool_choice=choice, response_format=fmt)
        spec = req.params.structured_outputs
        assert spec.where == "tools" and ("answer: %json" in spec.source) == (choice == "auto")
    req = _parse(tools=[_tool("f", {"type": "object"})], tool_choice="none", response_format=fmt)
    assert req.params.structured_outputs.where == "response_format.json_schema.schema"
    with pytest.raises(ValidationError, match="response_format.value must be a JSON format"):
        _parse(tools=[_tool("f", {"type": "object"})], response_format={"type": "regex", "value": "a+"})


def test_tgi_json_object_with_a_value_is_a_schema():
    req = _parse(response_format={"type": "json_object", "value": {"type": "object", "required": ["a"]}})
    spec = req.params.structured_outputs
    assert spec.kind == "json" and json.loads(spec.source) == {"type": "object", "required": ["a"]}
    assert spec.where == "response_format.value"


@pytest.mark.parametrize("schema", [Person.model_json_schema(), Node.model_json_schema(),
                                    {"definitions": {"A": {"type": "integer"}},
                                     "properties": {"a": {"$ref": "#/definitions/A"}}, "type": "object"}])
def test_local_refs_are_taken_for_every_tool_choice(schema):
    for choice in ("auto", "required", {"type": "function", "function": {"name": "g"}}):
        req = _parse(tools=[_tool("f", {"type": "object"}), _tool("g", schema)], tool_choice=choice)
        text = req.params.structured_outputs.source
        assert '"#/$defs/tool' in text and '"#/$defs/Address"' not in text and '"#/definitions/A"' not in text


@pytest.mark.parametrize("ref,why", [("#/$defs/Missing", "points at nothing"),
                                     ("https://example.com/s.json", "only local references")])
def test_a_bad_ref_is_refused_naming_the_tool_and_path(ref, why):
    schema = {"type": "object", "properties": {"a": {"$ref": ref}}, "$defs": {"B": {"type": "integer"}}}
    with pytest.raises(ValidationError) as e:
        _parse(tools=[_tool("f", {"type": "object"}), _tool("g", schema)])
    assert "tools[1].function.parameters" in str(e.value) and "/properties/a/$ref" in str(e.value)
    assert why in str(e.value) and "Lark" not in str(e.value)


def test_client_fields_take_what_they_can_and_refuse_by_name():
    ok = _parse(metadata={"k": "v"}, store=False, service_tier="auto", reasoning_effort="minimal",
                prompt_cache_key="pck", safety_identifier="user-1", verbosity="medium", modalities=["text"],
                audio=None, web_search_options=None)
    assert ok.client.safety_identifier == "user-1" and ok.client.prompt_cache_key == "pck"
    assert ok.params.cache_key == "pck"  # the instance router's hint (fleet.prefix_routing)
    assert _parse(store=True, metadata={"k": "v"}).client.metadata == (("k", "v"),)
    with pytest.raises(ValidationError, match="^Parameter store is not supported on /v1/completions"):
        parse_openai({"model": "m", "prompt": "hi", "store": True}, "completion",  # only chat completions are stored
                     limits=ProtocolLimits(vocab_size=100), model="m")
    for field, value, words in [("store", "yes", "a boolean"), ("service_tier", "flex", "one tier"),
                                ("reasoning_effort", "extreme", "none, minimal, low"), ("verbosity", "low", "shorter"),
                                ("modalities", ["text", "audio"], "text only"), ("audio", {"voice": "x"}, "audio"),
                                ("web_search_options", {}, "web search"),
                                ("prediction", {"type": "content", "content": "x"}, "predicted outputs"),
                                ("metadata", {"k": 1}, "string pairs")]:
        with pytest.raises(ValidationError, match=f"^Parameter {field} must") as e:
            _parse(**{field: value})
        assert words in str(e.value)
    assert _parse(stream=True, stream_options={"include_obfuscation": True}).obfuscate
    raw = _frames(_parse(stream=True, stream_options={"include_obfuscation": True}), ["a"])[0]
    assert json.loads(raw[len(b"data: "):])["obfuscation"]


def test_legacy_functions_map_to_tools_and_answer_in_their_shape():
    req = _parse(functions=[{"name": "f", "parameters": {"type": "object"}}], function_call="auto")
    assert req.tools is not None and req.tools.legacy and not req.tools.parallel and req.tools.choice == "auto"
    msg, reason = tool_response.message(req.tools, "r", 0, '<tool_call>\n{"name":"f","arguments":{}}\n</tool_call>',
                                        "stop")
    assert msg == {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}}
    assert reason == "function_call"
    stream = _parse(stream=True, functions=[{"name": "f"}], function_call={"name": "f"})
    assert stream.tools.choice == "f"
    raw = _frames(stream, ['<tool_call>\n{"name":"f","arguments":{}}\n</tool_call>'])[0]
    choice = json.loads(raw[len(b"data: "):])["choices"][0]
    assert choice["delta"] == {"function_call": {"name": "f", "arguments": "{}"}} and choice["finish_reason"] == "stop"
    hist = _parse(messages=[*MSGS, {"role": "assistant", "content": None, "function_call": {"name": "f",
                                                                                          "arguments": "{}"}},
                            {"role": "function", "name": "f", "content": "42"}], functions=[{"name": "f"}])
    assert hist.prompt.messages[1].tool_calls[0][1] == "f" and hist.prompt.messages[2].role == "tool"
    with pytest.raises(ValidationError, match=r"^Parameter functions\[0\] must be an object"):
        _parse(functions=[1])
    with pytest.raises(ValidationError, match="^Parameter functions must be absent when tools"):
        _parse(functions=[{"name": "f"}], tools=[_tool("g", {})])


def test_error_shapes():
    status, body = openai_error(MethodNotAllowedError("method PUT is not allowed"))
    assert status == 405 and body["error"]["type"] == "invalid_request_error"
    status, body = openai_error(ContextLengthError("Parameter messages must be at most 8 tokens"))
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"


class ChatRouteHttpTest(InProcessServer):
    def _post(self, path: str, body: dict, method: str = "POST"):
        return self.fetch(path, method=method, body=json.dumps(body), headers={"Content-Type": "application/json"})

    def test_unknown_routes_and_methods_under_v1_answer_in_openai_shape(self) -> None:
        for path, method, code in [("/v1/nothing", "POST", 404), ("/v1/chat/completions", "PUT", 405)]:
            r = self._post(path, {}, method)
            err = json.loads(r.body)["error"]
            assert r.code == code and err["type"] == "invalid_request_error" and err["message"], (path, r.body)
        assert json.loads(self.fetch("/nothing").body)["error_type"] == "not_found"  # MindIE's shape elsewhere

    def test_over_long_input_is_context_length_exceeded(self) -> None:
        r = self._post("/v1/chat/completions", {"model": "mock", "messages": [{"role": "user", "content": "a" * 200}]})
        assert r.code == 400 and json.loads(r.body)["error"]["code"] == "context_length_exceeded", r.body

    def test_tokenize_takes_tools_and_tool_call_messages(self) -> None:
        msgs = [*MSGS, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"}]
        plain = json.loads(self._post("/tokenize", {"messages": msgs}).body)
        with_tools = json.loads(self._post("/tokenize", {"messages": msgs, "tools": [_tool("f", {})]}).body)
        assert plain["count"] > 0 and with_tools["count"] > plain["count"], (plain, with_tools)

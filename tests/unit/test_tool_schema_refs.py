"""Tool schemas with local references, on the tiny model through the real grammar compiler (llguidance): pydantic's
nested and recursive models (``$defs``) compile under the tool-call wrapper for every tool_choice, and the calls
the model writes validate against the tool's own schema (jsonschema resolves the refs as the client meant them);
tools beside response_format: a reply is the format's JSON or a call; a schema the compiler refuses is named by
its tool and never by the grammar the server built."""
from __future__ import annotations

import json

import jsonschema
import pytest
from pydantic import BaseModel, Field

from mindie_service.errors import ValidationError
from mindie_service.llm import LLM
from mindie_service.protocol import tool_response
from mindie_service.protocol.openai import parse_openai
from mindie_service.protocol.request import ProtocolLimits
from mindie_service.sampling_params import SamplingParams
from mindie_service.structured.tool_formats import FORMATS


class Address(BaseModel):  # strings bounded: the random tiny model otherwise writes until the cap
    city: str = Field(max_length=8)
    zip: int = Field(ge=0, le=99999)


class Person(BaseModel):
    name: str = Field(max_length=8)
    home: Address


class Node(BaseModel):
    value: int = Field(ge=0, le=9)
    kids: list["Node"] = Field(default=[], max_length=2)


@pytest.fixture(scope="module")
def llm(tiny_model):
    return LLM(str(tiny_model))


def _request(tools: list[dict], **body):
    return parse_openai({"model": "m", "messages": [{"role": "user", "content": "call"}], "tools": tools, **body},
                        "chat", limits=ProtocolLimits(vocab_size=100), model="m",
                        request_id="chatcmpl-1", tool_format=FORMATS["hermes"])


def _run(llm, req, seed: int, max_tokens: int = 160):
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed,
                            structured_outputs=req.params.structured_outputs)
    ereq = llm.input_processor.process(req.prompt, params, request_id="r")
    out = llm.generate([list(ereq.prompt_token_ids)], params, use_tqdm=False)[0].outputs[0]
    return out.text, out.finish_reason


@pytest.mark.parametrize("model", [Person, Node])
@pytest.mark.parametrize("choice", ["required", "g"])
def test_calls_on_pydantic_schemas_validate_against_them(llm, model, choice):
    schema = model.model_json_schema()
    assert "$defs" in schema  # pydantic writes $defs for the nested and the recursive model
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}},
             {"type": "function", "function": {"name": "g", "parameters": schema}}]
    req = _request(tools, tool_choice=choice if choice == "required" else {"type": "function",
                                                                            "function": {"name": choice}})
    seen = 0
    for seed in range(3):
        text, finish = _run(llm, req, seed)
        if finish == "length":
            continue  # a recursive schema may nest past the cap
        msg, _ = tool_response.message(req.tools, "r", 0, text, "stop")
        for call in msg["tool_calls"]:
            args = json.loads(call["function"]["arguments"])
            jsonschema.validate(args, schema if call["function"]["name"] == "g" else tools[0]["function"]["parameters"])
            seen += call["function"]["name"] == "g"
    assert seen or choice == "required"


def test_auto_with_refs_compiles(llm):
    req = _request([{"type": "function", "function": {"name": "g", "parameters": Node.model_json_schema()}}])
    llm.input_processor.check_structured(req.params.structured_outputs)


def test_tools_beside_response_format_answer_the_format_or_call(llm):
    fmt = {"type": "object", "additionalProperties": False, "required": ["answer"],
           "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 9}}}
    tool = {"type": "object", "additionalProperties": False, "required": ["city"],
            "properties": {"city": {"enum": ["Paris", "Rome"]}}}
    req = _request([{"type": "function", "function": {"name": "w", "parameters": tool}}],
                   response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": fmt}},
                   parallel_tool_calls=False)
    kinds = set()
    for seed in range(6):
        text, finish = _run(llm, req, seed, max_tokens=60)
        assert finish != "length", text
        msg, _ = tool_response.message(req.tools, "r", 0, text, "stop")
        if msg.get("tool_calls"):
            jsonschema.validate(json.loads(msg["tool_calls"][0]["function"]["arguments"]), tool)
            kinds.add("call")
        else:
            jsonschema.validate(json.loads(msg["content"]), fmt)
            kinds.add("answer")
    assert kinds  # every reply was one or the other


def test_a_schema_the_compiler_refuses_is_named_by_its_tool(llm):
    bad = {"type": "object", "properties": {"a": {"type": "string", "pattern": "("}},
           "required": ["a"]}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
             {"type": "function", "function": {"name": "g", "parameters": bad}}]
    with pytest.raises(ValidationError) as e:
        llm.input_processor.check_structured(_request(tools, tool_choice="required").params.structured_outputs)
    msg = str(e.value)
    assert msg.startswith("Parameter tools[1].function.parameters must be"), msg
    assert "Lark" not in msg and "%json" not in msg and "start:" not in msg, msg

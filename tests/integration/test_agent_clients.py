"""The agent clients, unmodified, against a live server on the tiny model (issue 45): the ``anthropic`` SDK's
``messages.create`` and ``messages.stream`` with a tool round trip, greedy-identical to chat completions for the
same conversation; the ``openai`` client's streaming helper accumulating a forced tool call by index, with one
``tool_calls`` entry per index per chunk and no empty chunk."""
from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest

from tests.server_utils import ServerProcess, shared_server, write_config

pytestmark = pytest.mark.slow
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}}}
SYSTEM = "You answer briefly."
ASK = "What is the weather in Paris?"


def _blocks(msg, ids: bool = True) -> list[dict]:
    """A message's content blocks as plain data (the stream helper's blocks carry an extra parsed_output; a tool
    call's id is its request's)."""
    drop = {"parsed_output"} | (set() if ids else {"id"})
    return [{k: v for k, v in b.model_dump(exclude_none=True).items() if k not in drop} for b in msg.content]


@pytest.fixture(scope="module")
def srv(request, tiny_model) -> ServerProcess:
    """Room for the tools' system prompt (the tiny tokenizer spends many tokens on it)."""
    return shared_server("agents", request, lambda tmp: ServerProcess(
        write_config(tmp / "config.json", tiny_model, deploy={"maxSeqLen": 2048, "maxInputTokenLen": 1536}),
        tmp / "server.log"))


@pytest.fixture(scope="module")
def claude(srv) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url(), api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def oai(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url() + "/v1", api_key="none", max_retries=0)


def test_messages_are_greedy_identical_to_chat_streamed_and_whole(claude, oai):
    kw = dict(model="tiny", max_tokens=24, system=SYSTEM, messages=[{"role": "user", "content": ASK}],
              extra_body={"temperature": 0})
    msg = claude.messages.create(**kw)
    chat = oai.chat.completions.create(model="tiny", max_tokens=24, temperature=0,
                                       messages=[{"role": "system", "content": SYSTEM},
                                                 {"role": "user", "content": ASK}])
    assert msg.content[0].text == chat.choices[0].message.content
    assert msg.usage.input_tokens == chat.usage.prompt_tokens
    assert msg.usage.output_tokens == chat.usage.completion_tokens
    with claude.messages.stream(**kw) as stream:
        streamed = stream.get_final_message()
    assert _blocks(streamed) == _blocks(msg) and streamed.stop_reason == msg.stop_reason
    assert claude.messages.count_tokens(model="tiny", system=SYSTEM,
                                        messages=[{"role": "user", "content": ASK}]).input_tokens == \
        msg.usage.input_tokens


def test_a_tool_round_trip_through_create_and_stream(claude, oai):
    tools = [{"name": "get_weather", "description": "Weather in a city", "input_schema": WEATHER}]
    kw = dict(model="tiny", max_tokens=60, tools=tools, messages=[{"role": "user", "content": ASK}],
              tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0})
    msg = claude.messages.create(**kw)
    (call,) = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER)
    with claude.messages.stream(**kw) as stream:
        streamed = stream.get_final_message()
    assert _blocks(streamed, ids=False) == _blocks(msg, ids=False) and streamed.stop_reason == "tool_use"
    follow = [{"role": "user", "content": ASK}, {"role": "assistant", "content": _blocks(msg)},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21"}]}]
    answer = claude.messages.create(model="tiny", max_tokens=16, tools=tools, messages=follow,
                                    tool_choice={"type": "none"}, extra_body={"temperature": 0})
    assert answer.stop_reason in ("end_turn", "max_tokens") and answer.content[0].type == "text"
    chat = oai.chat.completions.create(  # the same conversation through the chat route: the same tokens
        model="tiny", max_tokens=16, temperature=0, tool_choice="none",
        tools=[{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                 "parameters": WEATHER}}],
        messages=[{"role": "user", "content": ASK},
                  {"role": "assistant", "content": None, "tool_calls": [{
                      "id": call.id, "type": "function",
                      "function": {"name": "get_weather", "arguments": json.dumps(call.input, separators=(",", ":"))}}]},
                  {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21"}])
    assert chat.choices[0].message.content == answer.content[0].text
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="tiny", max_tokens=8, messages=[{"role": "user", "content": ASK}],
                               thinking={"type": "enabled", "budget_tokens": 1024})
    assert e.value.body["error"]["type"] == "invalid_request_error" and "thinking" in e.value.message


def test_openai_streaming_helper_accumulates_a_forced_tool_call(oai):
    kw = dict(model="tiny", max_tokens=60, temperature=0, messages=[{"role": "user", "content": ASK}],
              tools=[{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}],
              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    whole = oai.chat.completions.create(**kw).choices[0].message.tool_calls
    with oai.chat.completions.stream(**kw) as stream:
        final = stream.get_final_completion().choices[0].message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in final] == \
        [(c.function.name, c.function.arguments) for c in whole]
    jsonschema.validate(json.loads(whole[0].function.arguments), WEATHER)
    for chunk in oai.chat.completions.create(**kw, stream=True):
        for choice in chunk.choices:
            entries = choice.delta.tool_calls or []
            assert len({e.index for e in entries}) == len(entries), chunk
            assert choice.delta.model_dump(exclude_none=True) or choice.finish_reason, chunk


def test_huggingface_hub_json_schema_arrives_as_a_schema(srv, monkeypatch):
    """huggingface_hub's chat_completion sends a json_schema as TGI's {"type": "json_object", "value": schema}."""
    import huggingface_hub.constants
    from huggingface_hub import InferenceClient

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # it talks to our local server only

    person = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
              "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0,
                                                                                 "maximum": 99}}}
    out = InferenceClient(base_url=srv.url()).chat_completion(
        [{"role": "user", "content": "A person?"}], max_tokens=60, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": person}})
    jsonschema.validate(json.loads(out.choices[0].message.content), person)

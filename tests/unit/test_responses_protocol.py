"""The Responses API's parser and emitter: Responses fields onto the chat request (one table), items onto chat
messages, fields we cannot honour refused by name; events numbered from 0 by one, in OpenAI's shapes (checked
with the openai client's own types); streamed and whole outputs identical over random chunkings."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st
from pydantic import TypeAdapter

from mindie_service.engine.contract import TokenInfo
from mindie_service.errors import ValidationError
from mindie_service.protocol.openai import parse_openai
from mindie_service.protocol.request import ProtocolLimits
from mindie_service.protocol.responses_events import ResponseEmitter
from mindie_service.protocol.responses_input import stored_items, to_messages
from mindie_service.protocol.responses_request import parse_responses
from mindie_service.protocol.tool_calls import parse_tools
from mindie_service.structured.tool_formats import FORMATS

KW = dict(limits=ProtocolLimits(vocab_size=1000), model="m", tool_format=FORMATS["hermes"])
TOOL = {"type": "function", "name": "get_weather", "description": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def _parse(body, history=()):
    return parse_responses({"model": "m", **body}, list(history), **KW)


def test_string_input_and_instructions_make_the_chat_request_of_the_same_conversation():
    r = _parse({"input": "Hi", "instructions": "Be brief.", "max_output_tokens": 7, "temperature": 0,
                "top_p": 0.5, "user": "u1"})
    chat = parse_openai({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                                     {"role": "user", "content": "Hi"}],
                         "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5, "user": "u1"}, "chat", **KW)
    assert r.chat.prompt == chat.prompt and r.chat.params == chat.params
    assert r.options.store is True and r.options.background is False


def test_items_become_chat_messages_calls_joined_to_one_assistant_turn():
    items = [{"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "let me see"}]},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
             {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"x\":1}"},
             {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
             {"type": "reasoning", "id": "rs_1", "summary": []}]
    assert to_messages(items) == [
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "let me see", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{\"x\":1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    lone = to_messages([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}])
    assert lone[0]["content"] is None
    after = to_messages([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                         {"role": "assistant", "content": [{"type": "output_text", "text": "more"}]}])
    assert len(after) == 1 and after[0]["content"] == "more" and after[0]["tool_calls"][0]["id"] == "c"


def test_flat_function_tools_and_choice_map_to_chat_tools():
    r = _parse({"input": "w?", "tools": [TOOL], "tool_choice": {"type": "function", "name": "get_weather"}})
    want = parse_tools({"tools": [{"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}],
                        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, FORMATS["hermes"])
    assert r.chat.tools == want and r.chat.params.structured_outputs is not None


@pytest.mark.parametrize("body, param", [
    ({"input": "x", "frobnicate": 1}, "frobnicate"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "x", "reasoning": {"summary": "auto"}}, "reasoning.summary"),
    ({"input": "x", "reasoning": {"effort": "huge"}}, "reasoning.effort"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"input": "x", "include": ["file_search_call.results"]}, "include"),
    ({"input": [{"type": "computer_call"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0].type"),
    ({"input": "x", "background": True, "store": False}, "background"),
    ({"input": "x", "truncation": "sometimes"}, "truncation"),
    ({"input": "x", "metadata": {"k": 1}}, "metadata.k"),
])
def test_what_cannot_be_honoured_is_refused_naming_the_field(body, param):
    with pytest.raises(ValidationError) as e:
        _parse(body)
    assert e.value.message.startswith(f"Parameter {param} "), e.value.message


def test_text_format_json_schema_goes_through_the_grammars():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    r = _parse({"input": "x", "text": {"format": {"type": "json_schema", "name": "s", "schema": schema}}})
    spec = r.chat.params.structured_outputs
    assert spec is not None and json.loads(spec.source)["properties"] == schema["properties"]
    assert _parse({"input": "x", "text": {"format": {"type": "json_object"}}}).chat.params.structured_outputs


def test_history_is_prepended_before_the_input():
    hist = stored_items([{"role": "user", "content": "first"}], "abc") + [
        {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "answer", "annotations": []}]}]
    r = _parse({"input": "second"}, hist)
    assert [(m.role, m.content) for m in r.chat.prompt.messages] == [
        ("user", "first"), ("assistant", "answer"), ("user", "second")]


# -- events -------------------------------------------------------------------------------------------------
EVENTS = TypeAdapter(__import__("openai").types.responses.ResponseStreamEvent)
TEXTS = st.lists(st.sampled_from(["hi ", "<tool_call>", "\n", '{"name": "f", "arguments": {"a": 1}}', "</tool_call>",
                                  "é", "{", "}", '"', " ", "[TOOL_CALLS]", "[", "]", ",", "<|python_tag|>", "; "]),
                 max_size=12).map("".join)


def _emit(text: str, cuts: list[int], tools) -> tuple[ResponseEmitter, list[dict]]:
    em = ResponseEmitter("resp_" + "ab" * 24, tools, None)
    bounds = sorted({0, len(text), *[c for c in cuts if 0 < c < len(text)]})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])] + [""]
    evs = []
    for i, piece in enumerate(pieces):
        evs += em.feed(piece, [TokenInfo(1, -0.5, piece, False)], final=i == len(pieces) - 1)
    return em, evs + em.finish("completed")


@settings(max_examples=500, deadline=None)
@given(text=TEXTS, cuts=st.lists(st.integers(0, 120), max_size=10), fmt=st.sampled_from([None, *sorted(FORMATS)]))
def test_streamed_items_equal_the_whole_ones_and_events_are_numbered_by_one(text, cuts, fmt):
    """Every tool-call format (None: no tools), any text, any chunking: the same items, in the same order."""
    tr = parse_tools({"tools": [{"type": "function", "function": {"name": "f"}}]}, FORMATS[fmt]) if fmt else None
    whole, _ = _emit(text, [], tr)
    streamed, evs = _emit(text, cuts, tr)
    assert streamed.output() == whole.output()
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    for e in evs:
        EVENTS.validate_python(e)  # the openai client's own event types accept each one
    # A client rebuilding the output from the deltas gets the items.
    texts = "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta")
    args = "".join(e["delta"] for e in evs if e["type"] == "response.function_call_arguments.delta")
    assert texts == "".join(it["content"][0]["text"] for it in whole.output() if it["type"] == "message")
    assert args == "".join(it["arguments"] for it in whole.output() if it["type"] == "function_call")


def test_a_tool_call_is_a_function_call_item_with_its_call_id():
    tr = parse_tools({"tools": [{"type": "function", "function": {"name": "f"}}]}, FORMATS["hermes"])
    em, evs = _emit('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>', [5, 17, 30], tr)
    (item,) = em.output()
    assert item["type"] == "function_call" and item["name"] == "f" and json.loads(item["arguments"]) == {"a": 1}
    assert item["call_id"].startswith("call_") and item["id"].startswith("fc_") and item["status"] == "completed"
    kinds = [e["type"] for e in evs]
    assert kinds[0] == "response.output_item.added" and "response.function_call_arguments.done" in kinds


def test_an_empty_answer_is_one_empty_message():
    em, evs = _emit("", [], None)
    assert [it["content"][0]["text"] for it in em.output()] == [""]
    assert evs[-1]["type"] == "response.output_item.done"


def test_reasoning_effort_is_chat_s_reasoning_effort():
    from mindie_service.protocol.reasoning_fields import EFFORT_BUDGETS
    low = _parse({"input": "x", "reasoning": {"effort": "low", "summary": None}})
    assert low.chat.params.thinking_budget == EFFORT_BUDGETS["low"] and low.options.reasoning_effort == "low"
    chat = parse_openai({"model": "m", "messages": [{"role": "user", "content": "x"}], "reasoning_effort": "low"},
                        "chat", **KW)
    assert low.chat.params == chat.params
    off = _parse({"input": "x", "reasoning": {"effort": "none"}})
    assert off.chat.params.thinking_budget is None and dict(off.chat.prompt.template_kwargs) == {"enable_thinking": False}


THOUGHTS = st.lists(st.sampled_from(["hm", " ", "é", "so\n", "<", "think"]), max_size=8).map("".join)


@settings(max_examples=300, deadline=None)
@given(thought=THOUGHTS, text=TEXTS, cuts=st.lists(st.integers(0, 60), max_size=8))
def test_thinking_is_a_reasoning_item_before_the_answer_streamed_as_whole(thought, text, cuts):
    """The thinking deltas (as the engine's split gives them, before the answer) make one reasoning item whose
    reasoning_text is the thinking, then the answer's items; any chunking gives the same items."""
    whole = ResponseEmitter("resp_" + "cd" * 24, None, None)
    whole_evs = whole.feed(text, final=True, thought=thought) + whole.finish("completed")
    em = ResponseEmitter("resp_" + "cd" * 24, None, None)
    bounds = sorted({0, len(thought), *[c for c in cuts if 0 < c < len(thought)]})
    evs = [e for a, b in zip(bounds, bounds[1:]) for e in em.feed("", thought=thought[a:b])]
    evs += em.feed(text, final=True) + em.finish("completed")
    assert em.output() == whole.output()
    out = em.output()
    if thought:
        assert out[0]["type"] == "reasoning" and out[0]["content"] == [{"type": "reasoning_text", "text": thought}]
        assert out[0]["id"].startswith("rs_") and out[0]["summary"] == [] and out[0]["status"] == "completed"
    assert out[-1]["type"] == "message" and out[-1]["content"][0]["text"] == text
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    for e in evs + whole_evs:
        EVENTS.validate_python(e)
    assert "".join(e["delta"] for e in evs if e["type"] == "response.reasoning_text.delta") == thought
    done = [e["text"] for e in evs if e["type"] == "response.reasoning_text.done"]
    assert done == ([thought] if thought else [])


def test_cut_while_thinking_is_one_incomplete_reasoning_item_and_no_message():
    em = ResponseEmitter("resp_" + "ef" * 24, None, None)
    em.feed("", thought="hm so")
    em.finish("incomplete")
    assert [(it["type"], it["status"]) for it in em.output()] == [("reasoning", "incomplete")]
    done = ResponseEmitter("resp_" + "ef" * 24, None, None)
    done.feed("", thought="hm", final=True)
    done.finish("completed")  # the end of thinking and of the answer at once: the answer is empty, not absent
    assert [(it["type"], it["status"]) for it in done.output()] == [("reasoning", "completed"), ("message", "completed")]

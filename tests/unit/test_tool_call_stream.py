"""One tool-call parser for the stream and the whole answer: for any schema, seed and chunking, the content
and calls assembled from the stream equal the non-streamed answer (SGLang #35564 is the bug this guards)."""
from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mindie_service.inputs.types import ChatMessage, ChatPrompt
from mindie_service.llm import LLM
from mindie_service.protocol import tool_response
from mindie_service.protocol.tool_calls import ToolsRequest
from mindie_service.protocol.tool_parser import ToolCallParser
from mindie_service.sampling_params import SamplingParams
from mindie_service.structured.tool_formats import FORMATS


def _assemble(fmt, text: str, cuts: list[int]) -> tuple[str, list[tuple[str, str, str]]]:
    """Feed ``text`` cut at ``cuts``; rebuild content and calls from the deltas as a client would."""
    p = ToolCallParser(fmt, id_prefix="call_x_")
    content, calls = "", {}
    bounds = sorted({0, len(text), *[c for c in cuts if 0 < c < len(text)]})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])] + [""]
    for i, piece in enumerate(pieces):
        got, deltas = p.feed(piece, final=i == len(pieces) - 1)
        content += got
        for d in deltas:
            if d.id is not None:
                calls[d.index] = [d.id, d.name, ""]
            calls[d.index][2] += d.arguments
    return content, [tuple(c) for c in calls.values()]


def _whole(fmt, text: str) -> tuple[str, list[tuple[str, str, str]]]:
    p = ToolCallParser(fmt, id_prefix="call_x_")
    p.feed(text, final=True)
    return p.content, [(c.id, c.name, c.arguments) for c in p.calls]


TEXTS = st.lists(st.sampled_from(['<tool_call>', '\n', '{"name":"f","arguments":{"a":1}}', '</tool_call>', 'hi ',
                                  '[TOOL_CALLS]', '[', ']', ',', '; ', '{"arguments":{"x":"}"},"name":"g"}', '{',
                                  '"', '\\', '<|python_tag|>', ' ', '}', '"name"', ':']), max_size=14).map("".join)


@settings(max_examples=400, deadline=None)
@given(fmt=st.sampled_from(sorted(FORMATS)), text=TEXTS, cuts=st.lists(st.integers(0, 200), max_size=12))
def test_any_text_any_chunking_streams_to_the_whole_answer(fmt, text, cuts):
    assert _assemble(FORMATS[fmt], text, cuts) == _whole(FORMATS[fmt], text)


@pytest.fixture(scope="module")
def llm(tiny_model):
    return LLM(str(tiny_model))


PROPS = st.dictionaries(st.sampled_from(["city", "n", "ok", "tag", "items"]), st.sampled_from([
    {"type": "string", "maxLength": 8}, {"type": "integer", "minimum": 0, "maximum": 999}, {"type": "boolean"},
    {"enum": ["a", "b", "c d"]}, {"type": "array", "items": {"type": "integer", "maximum": 9, "minimum": 0},
                                  "maxItems": 3}]), min_size=1, max_size=4)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(props=PROPS, seed=st.integers(0, 2**32), choice=st.sampled_from(["required", "auto", "f"]),
       fmt=st.sampled_from(sorted(FORMATS)), cuts=st.lists(st.integers(0, 400), max_size=20))
def test_model_tool_calls_stream_as_they_answer_whole(llm, props, seed, choice, fmt, cuts):
    schema = {"type": "object", "properties": props, "required": sorted(props)}
    tools = ({"type": "function", "function": {"name": "f", "parameters": schema}},
             {"type": "function", "function": {"name": "g", "parameters": {"type": "object", "properties": {}}}})
    req = ToolsRequest(tools, choice, False, FORMATS[fmt])
    prompt = ChatPrompt((ChatMessage("user", "call f"),), tools, FORMATS[fmt])
    ereq = llm.input_processor.process(prompt, SamplingParams(max_tokens=120, temperature=1.0, seed=seed,
                                                              structured_outputs=req.spec()), request_id="p")
    out = llm.generate([list(ereq.prompt_token_ids)], SamplingParams(max_tokens=120, temperature=1.0, seed=seed,
                                                                     structured_outputs=req.spec()),
                       use_tqdm=False)[0].outputs[0]
    whole = _whole(FORMATS[fmt], out.text)
    assert _assemble(FORMATS[fmt], out.text, cuts) == whole
    msg, reason = tool_response.message(req, "rid", 0, out.text, "stop" if out.finish_reason != "length" else "length")
    if choice != "auto" and out.finish_reason != "length":
        assert whole[1] and reason == ("stop" if choice == "f" else "tool_calls")
        for _, name, args in whole[1]:
            jsonschema.validate(json.loads(args), schema if name == "f" else {"type": "object"})

"""Every key a route accepts has its effect, or is refused by name (issue 47, the house rule): TGI's /generate*,
Triton's generate extension, OIP's infer (its binary extension: binary_data / binary_data_output answer binary,
read back by tritonclient's own decoder), POST / and /v1/tokenizer, batch jobs; and vLLM's role chunk's usage with
continuous_usage_stats."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mindie_service.errors import ValidationError
from mindie_service.jobs.spec import parse_job_request
from mindie_service.protocol.mindie import parse_mindie_request, parse_tokenizer_request
from mindie_service.protocol.oip import infer_response, parse_infer
from mindie_service.protocol.oip_binary import binary_answer
from mindie_service.protocol.openai import parse_openai
from mindie_service.protocol.openai_encoder import OpenAIEncoder
from mindie_service.protocol.request import GenerationResult, ProtocolLimits
from mindie_service.protocol.tgi import parse_tgi_request
from mindie_service.protocol.triton_generate import ModelRef, parse_generate_request
from mindie_service.engine.contract import TokenInfo

LIM = ProtocolLimits(vocab_size=100)
TEXT = {"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["hi"]}


def refused(name: str, fn, *args, **kw) -> str:
    with pytest.raises(ValidationError) as e:
        fn(*args, **kw)
    assert f"Parameter {name} is not supported" in e.value.message, e.value.message
    return e.value.message


@pytest.mark.parametrize("stream", [False, True])
def test_tgi_refuses_unknown_keys_by_name(stream):
    parse_tgi_request({"inputs": "hi", "parameters": {"max_new_tokens": 3, "stop": ["x"]}}, LIM, stream=stream)
    refused("parameters.foo", parse_tgi_request, {"inputs": "hi", "parameters": {"foo": 1}}, LIM, stream=stream)
    refused("parameters.priority", parse_tgi_request, {"inputs": "hi", "parameters": {"priority": 1}}, LIM,
            stream=stream)  # TGI has no priority: it would have no effect
    refused("bar", parse_tgi_request, {"inputs": "hi", "bar": 1}, LIM, stream=stream)
    parse_tgi_request({"inputs": "hi", "stream": stream}, LIM, stream=stream)  # says what the route does
    with pytest.raises(ValidationError, match="Parameter stream must be"):
        parse_tgi_request({"inputs": "hi", "stream": not stream}, LIM, stream=stream)


def test_triton_generate_refuses_unknown_keys_by_name():
    assert parse_generate_request({"id": "a", "text_input": "hi", "parameters": {"priority": 1}}, LIM,
                                  stream=False).rank == -4
    refused("parameters.foo", parse_generate_request, {"text_input": "hi", "parameters": {"foo": 1}}, LIM,
            stream=True)
    refused("extra_input", parse_generate_request, {"text_input": "hi", "extra_input": "x"}, LIM, stream=False)


def test_root_and_tokenizer_refuse_unknown_top_level_keys():
    parse_mindie_request({"inputs": "hi", "stream": False, "parameters": {"priority": 2}}, LIM)
    refused("foo", parse_mindie_request, {"inputs": "hi", "foo": 1}, LIM)
    assert parse_tokenizer_request({"inputs": "hi"}) == "hi"
    refused("add_special_tokens", parse_tokenizer_request, {"inputs": "hi", "add_special_tokens": False})


@pytest.mark.parametrize("body, name", [
    ({"inputs": [TEXT], "sequence_id": 3}, "sequence_id"),
    ({"inputs": [TEXT], "parameters": {"sequence_id": 3}}, "parameters.sequence_id"),
    ({"inputs": [{**TEXT, "foo": 1}]}, "inputs[0].foo"),
    ({"inputs": [{**TEXT, "parameters": {"foo": 1}}]}, "inputs[0].parameters.foo"),
    ({"inputs": [TEXT], "outputs": [{"name": "text_output", "parameters": {"classification": 2}}]},
     "outputs[0].parameters.classification"),
    ({"inputs": [TEXT], "outputs": [{"name": "text_output", "shape": [1]}]}, "outputs[0].shape")])
def test_oip_refuses_unknown_keys_by_name(body, name):
    refused(name, parse_infer, body, LIM)


def _answer(req, texts, ids):
    results = []
    for t, row in zip(texts, ids):
        r = GenerationResult()
        r.tokens = [TokenInfo(i, None, "", False) for i in row]
        r.deltas = [t]
        r.full_text = t
        results.append(r)
    return infer_response(ModelRef("tiny"), req, results)


def test_oip_binary_outputs_as_tritonclient_reads_them():
    from tritonclient.http import InferResult

    body = {"inputs": [{**TEXT, "shape": [2], "data": ["a", "b"]}], "parameters": {"binary_data_output": True}}
    assert parse_infer(body, LIM).binary == {"text_output"}  # tritonclient's default: outputs unnamed
    assert parse_infer({"inputs": [TEXT]}, LIM).binary == set()
    body["outputs"] = [{"name": "text_output", "parameters": {"binary_data": False}},
                       {"name": "output_ids", "parameters": {"binary_data": True}}]
    req = parse_infer(body, LIM)
    assert req.binary == {"output_ids"}  # an output's own binary_data wins over binary_data_output
    answer = _answer(req, ["héllo", "x"], [[5, 6, 7], [9]])
    raw, header_len = binary_answer(answer, req.binary)
    header = json.loads(raw[:header_len])
    assert header["outputs"][0]["data"] == ["héllo", "x"] and "data" not in header["outputs"][1]
    res = InferResult.from_response_body(raw, header_length=header_len)
    assert res.as_numpy("text_output").tolist() == ["héllo", "x"]
    assert res.as_numpy("output_ids").tolist() == [[5, 6, 7], [9, -1, -1]]
    both = frozenset({"text_output", "output_ids"})
    raw, header_len = binary_answer(_answer(req, ["héllo", "x"], [[5], [9]]), both)
    res = InferResult.from_response_body(raw, header_length=header_len)
    assert [x.decode() for x in res.as_numpy("text_output")] == ["héllo", "x"]
    assert np.array_equal(res.as_numpy("output_ids"), [[5], [9]])
    assert binary_answer(answer, frozenset()) is None  # nothing asked binary: plain JSON


def test_batch_job_refuses_unknown_top_level_keys():
    base = {"model": "m", "prompt_file_path": {"value": "a.jsonl", "type": "filepath"}, "options": {"max_tokens": 4},
            "num_generations": 2, "keep_alive": "5m"}
    assert parse_job_request(base, 100).num_generations == 2
    refused("priority", parse_job_request, {**base, "priority": 1}, 100)


def test_role_chunk_carries_the_prompt_usage_with_continuous_usage_stats():
    def role(stream_options):
        req = parse_openai({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                            "stream_options": stream_options}, "chat", limits=LIM, model="m", request_id="r")
        first = GenerationResult(num_prompt_tokens=7)
        return json.loads(OpenAIEncoder().stream_start(req, 1, first)[len(b"data: "):])

    assert role({"include_usage": True, "continuous_usage_stats": True})["usage"] == \
        {"prompt_tokens": 7, "completion_tokens": 0, "total_tokens": 7}  # vLLM's serving_chat.py
    assert role({"include_usage": True})["usage"] is None  # include_usage alone: the last chunk only

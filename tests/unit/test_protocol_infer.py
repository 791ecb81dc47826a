"""POST /infer's body (protocol.mindie_infer): POST /'s fields plus priority (mapped onto the scheduler's rank)
and timeout, each range refused with MindIE's message; Triton's and OIP's bodies (protocol.triton_generate,
protocol.oip) into the same GenerationRequest as POST /'s."""
from __future__ import annotations

import pytest

from mindie_service.errors import NotFoundError, ValidationError
from mindie_service.inputs.types import TextPrompt, TokensPrompt
from mindie_service.protocol.mindie import parse_mindie_request
from mindie_service.protocol.mindie_infer import InferEncoder, parse_infer_request
from mindie_service.protocol.oip import parse_infer
from mindie_service.protocol.request import GenerationResult, ProtocolLimits
from mindie_service.protocol.triton_generate import parse_generate_request, resolve_model

LIMITS = ProtocolLimits(vocab_size=1000)
P = {"max_new_tokens": 7, "top_k": 5, "temperature": 0.5, "seed": 3, "stop": ["x"]}


def test_priority_maps_to_rank_and_timeout_is_kept():
    r = parse_infer_request({"inputs": "hi", "parameters": {"priority": 1, "timeout": 7}}, LIMITS)
    assert (r.gen.rank, r.timeout) == (-4, 7.0)
    d = parse_infer_request({"inputs": "hi"}, LIMITS)
    assert (d.gen.rank, d.timeout) == (0, 600.0)  # MindIE's defaults: priority 5, timeout 600 s


@pytest.mark.parametrize("params, message", [
    ({"priority": 0}, "Parameter priority must be in [1, 5], got 0"),
    ({"priority": 2.5}, "priority"),
    ({"timeout": 0}, "Parameter timeout must be in (0, 3600], got 0"),
    ({"timeout": 3601}, "timeout")])
def test_out_of_range_is_refused_naming_the_field(params, message):
    with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("(", r"\(")):
        parse_infer_request({"inputs": "hi", "parameters": params}, LIMITS)


def test_every_route_reads_the_same_parameters_as_root():
    root = parse_mindie_request({"inputs": "hi", "parameters": P}, LIMITS)
    assert parse_infer_request({"inputs": "hi", "parameters": P}, LIMITS).gen == root
    assert parse_generate_request({"text_input": "hi", "parameters": P}, LIMITS, stream=False) == root
    oip = parse_infer({"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["hi"]}],
                       "parameters": P}, LIMITS)
    assert oip.gens == [root]


def test_infer_answers_one_object():
    req = parse_infer_request({"inputs": "hi"}, LIMITS).gen
    r = GenerationResult(full_text="ok")
    assert InferEncoder().complete(req, [r]) == {"generated_text": "ok"}


def test_oip_input_ids_rows_and_nested_data():
    body = {"inputs": [{"name": "input_ids", "shape": [2, 2], "datatype": "INT32", "data": [[1, 2], [3, 4]]}]}
    assert [g.prompt for g in parse_infer(body, LIMITS).gens] == [TokensPrompt((1, 2)), TokensPrompt((3, 4))]
    body = {"inputs": [{"name": "text_input", "shape": [2, 1], "datatype": "BYTES", "data": [["a"], ["b"]]}]}
    assert [g.prompt for g in parse_infer(body, LIMITS).gens] == [TextPrompt("a"), TextPrompt("b")]


@pytest.mark.parametrize("body, needle", [
    ({"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["a"],
                  "parameters": {"binary_data_size": 5}}]}, "binary"),
    ({"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
      "parameters": {"details": True}}, "details"),
    ({"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
      "outputs": [{"name": "logits"}]}, "outputs"),
    ({"inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT64", "data": [-1]}]}, "token ids"),
    ({"inputs": [{"name": "text_input", "shape": [2], "datatype": "BYTES", "data": ["a"]}]}, "2 elements"),
    # schemathesis' finds: a list where an object belongs, no outputs at all
    ({"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["a"],
                  "parameters": [None, None]}]}, "text_input.parameters must be an object"),
    ({"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["a"]}], "outputs": []},
     "non-empty"),
    ({"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
      "outputs": [{"name": ["text_output"]}]}, "outputs")])
def test_oip_refusals(body, needle):
    with pytest.raises(ValidationError, match=needle):
        parse_infer(body, LIMITS)


def test_unknown_model_or_version_is_not_found():
    assert resolve_model("tiny", None, "tiny").version == "1"
    with pytest.raises(NotFoundError, match="'other'"):
        resolve_model("other", None, "tiny")
    with pytest.raises(NotFoundError, match="version 2"):
        resolve_model("tiny", "2", "tiny")


def _binary(header: dict, payload: bytes) -> tuple[bytes, str]:
    import json

    head = json.dumps(header).encode()
    return head + payload, str(len(head))


def test_binary_tensors_decode_as_triton_sends_them():
    from mindie_service.protocol.oip_binary import read_binary_request

    texts = b"".join(len(s).to_bytes(4, "little") + s for s in (b"hi", "h\u00e9".encode()))
    raw, n = _binary({"inputs": [{"name": "text_input", "shape": [2], "datatype": "BYTES",
                                  "parameters": {"binary_data_size": len(texts)}}]}, texts)
    assert [g.prompt for g in parse_infer(read_binary_request(raw, n), LIMITS).gens] == \
        [TextPrompt("hi"), TextPrompt("h\u00e9")]
    ids = b"".join(v.to_bytes(8, "little") for v in (5, 7, 9))
    raw, n = _binary({"inputs": [{"name": "input_ids", "shape": [1, 3], "datatype": "INT64",
                                  "parameters": {"binary_data_size": len(ids)}}]}, ids)
    assert parse_infer(read_binary_request(raw, n), LIMITS).gens[0].prompt == TokensPrompt((5, 7, 9))


@pytest.mark.parametrize("size, extra, needle", [(9, b"", "binary_data_size"), (6, b"", "a multiple of 4"),
                                                 (8, b"zz", "header bytes plus")])
def test_binary_body_that_disagrees_with_its_sizes_is_refused(size, extra, needle):
    from mindie_service.protocol.oip_binary import read_binary_request

    raw, n = _binary({"inputs": [{"name": "input_ids", "shape": [2], "datatype": "INT32",
                                  "parameters": {"binary_data_size": size}}]}, (1).to_bytes(4, "little") * 2 + extra)
    with pytest.raises(ValidationError, match=needle):
        read_binary_request(raw, n)


def test_triton_answers_and_errors_in_its_shape():
    from mindie_service.errors import GenerationError
    from mindie_service.protocol.triton_generate import ModelRef, TritonEncoder

    enc = TritonEncoder(ModelRef("tiny"), "c7")
    req = parse_generate_request({"text_input": "hi"}, LIMITS, stream=False)
    assert enc.complete(req, [GenerationResult(full_text="ok")]) == \
        {"id": "c7", "model_name": "tiny", "model_version": "1", "text_output": "ok"}
    assert enc.stream_error(GenerationError("boom")) == b'data: {"error":"boom"}\n\n'

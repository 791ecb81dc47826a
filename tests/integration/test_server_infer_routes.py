"""MindIE's native POST /infer, Triton's generate extension and the Open Inference Protocol v2 against the
real server on the tiny model: each route's greedy output equals POST /'s, tritonclient talks to it unmodified,
and each route answers errors (unknown model: 404) in its own shape."""
from __future__ import annotations

import numpy as np
import pytest

from tests.server_utils import plain_server, sse_frames

PROMPT = "Once upon a time in a quiet harbor"
PARAMS = {"max_new_tokens": 12, "details": True}


@pytest.fixture(scope="module")
def srv(request, tiny_model):
    return plain_server(request, tiny_model)


@pytest.fixture(scope="module")
def expected(srv):
    r = srv.post("/", {"inputs": PROMPT, "parameters": PARAMS})
    assert r.status_code == 200, r.text
    return r.json()[0]


def test_infer_matches_root(srv, expected):
    r = srv.post("/infer", {"inputs": PROMPT, "stream": False, "parameters": {**PARAMS, "priority": 5, "timeout": 30}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert isinstance(body, dict)  # /infer answers one object, / a one-element list
    assert body["generated_text"] == expected["generated_text"]
    assert [t["id"] for t in body["details"]["tokens"]] == [t["id"] for t in expected["details"]["tokens"]]


def test_infer_stream_as_root(srv, expected):
    with srv.post("/infer", {"inputs": PROMPT, "stream": True, "parameters": PARAMS}, stream=True) as r:
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        frames = list(sse_frames(r))
    assert all(isinstance(f["token"]["id"], list) for f in frames)
    assert "".join(f["token"]["text"] for f in frames) == expected["generated_text"]
    assert frames[-1]["generated_text"] == expected["generated_text"]
    assert frames[-1]["details"]["finish_reason"] == expected["details"]["finish_reason"]


@pytest.mark.parametrize("params, needle", [({"priority": 0}, "priority"), ({"priority": 6}, "priority"),
                                            ({"timeout": 0}, "timeout"), ({"timeout": 3601}, "timeout")])
def test_infer_refusals_in_mindie_shape(srv, params, needle):
    r = srv.post("/infer", {"inputs": PROMPT, "parameters": params})
    assert r.status_code == 422 and r.json()["error_type"] == "validation" and needle in r.json()["error"], r.text


@pytest.mark.parametrize("base", ["/v2/models/tiny", "/v2/models/tiny/versions/1"])
def test_triton_generate_matches_root(srv, expected, base):
    r = srv.post(f"{base}/generate", {"id": "a1", "text_input": PROMPT, "parameters": PARAMS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["id"], body["model_name"], body["model_version"]) == ("a1", "tiny", "1")
    assert body["text_output"] == expected["generated_text"]
    with srv.post(f"{base}/generate_stream", {"text_input": PROMPT, "parameters": PARAMS}, stream=True) as r:
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        frames = list(sse_frames(r))
    assert "".join(f["text_output"] for f in frames) == expected["generated_text"]
    assert all(f["model_name"] == "tiny" for f in frames)
    assert frames[-1]["details"]["finish_reason"] == expected["details"]["finish_reason"]


def test_oip_infer_matches_root(srv, expected):
    ids = [t["id"] for t in expected["details"]["tokens"]]
    body = {"id": "q", "inputs": [{"name": "text_input", "shape": [2], "datatype": "BYTES", "data": [PROMPT, PROMPT]}],
            "outputs": [{"name": "text_output"}, {"name": "output_ids"}], "parameters": {"max_new_tokens": 12}}
    r = srv.post("/v2/models/tiny/infer", body)
    assert r.status_code == 200, r.text
    out = {o["name"]: o for o in r.json()["outputs"]}
    assert out["text_output"]["data"] == [expected["generated_text"]] * 2
    assert out["output_ids"]["shape"][0] == 2 and out["output_ids"]["data"][:len(ids)] == ids
    prompt_ids = srv.post("/v1/tokenizer", {"inputs": PROMPT}).json()["tokens"]
    body = {"inputs": [{"name": "input_ids", "shape": [1, len(prompt_ids)], "datatype": "INT64", "data": prompt_ids}],
            "parameters": {"max_new_tokens": 12}}
    r = srv.post("/v2/models/tiny/versions/1/infer", body)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [expected["generated_text"]]


def test_tritonclient_unmodified(srv, expected):
    httpclient = pytest.importorskip("tritonclient.http")
    client = httpclient.InferenceServerClient(srv.url().split("://", 1)[1])
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("tiny")
    meta = client.get_model_metadata("tiny")
    assert {i["name"] for i in meta["inputs"]} == {"text_input", "input_ids"}
    assert client.get_server_metadata()["extensions"] == ["generate"]
    inp = httpclient.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([PROMPT.encode()], dtype=object), binary_data=False)
    res = client.infer("tiny", [inp], parameters={"max_new_tokens": 12},
                       outputs=[httpclient.InferRequestedOutput("text_output", binary_data=False)])
    assert [x.decode() if isinstance(x, bytes) else x for x in res.as_numpy("text_output")] == \
        [expected["generated_text"]]
    # the client's defaults: binary input tensors (its binary extension), outputs unnamed
    text = httpclient.InferInput("text_input", [2], "BYTES")
    text.set_data_from_numpy(np.array([PROMPT.encode(), PROMPT.encode()], dtype=object))
    res = client.infer("tiny", [text], parameters={"max_new_tokens": 12})
    assert [x.decode() if isinstance(x, bytes) else x for x in res.as_numpy("text_output")] == \
        [expected["generated_text"]] * 2
    prompt_ids = srv.post("/v1/tokenizer", {"inputs": PROMPT}).json()["tokens"]
    ids = httpclient.InferInput("input_ids", [1, len(prompt_ids)], "INT32")
    ids.set_data_from_numpy(np.array([prompt_ids], dtype=np.int32))
    res = client.infer("tiny", [ids], parameters={"max_new_tokens": 12},
                       outputs=[httpclient.InferRequestedOutput("output_ids")])
    assert list(res.as_numpy("output_ids")[0]) == [t["id"] for t in expected["details"]["tokens"]]


@pytest.mark.parametrize("method, path, body", [
    ("post", "/v2/models/nope/generate", {"text_input": "x"}),
    ("post", "/v2/models/nope/generate_stream", {"text_input": "x"}),
    ("post", "/v2/models/tiny/versions/7/generate", {"text_input": "x"}),
    ("post", "/v2/models/nope/infer", {"inputs": []}),
    ("get", "/v2/models/nope", None), ("get", "/v2/models/nope/ready", None)])
def test_unknown_model_is_404_in_v2_shape(srv, method, path, body):
    r = srv.post(path, body) if method == "post" else srv.get(path)
    assert r.status_code == 404 and set(r.json()) == {"error"} and "nope" in r.json()["error"] or "7" in r.text


@pytest.mark.parametrize("path, body, needle", [
    ("/v2/models/tiny/generate", {"text_input": ""}, "text_input"),
    ("/v2/models/tiny/infer", {"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": ["a"]}]},
     "inputs[0].name"),
    ("/v2/models/tiny/infer", {"inputs": [{"name": "text_input", "shape": [2], "datatype": "BYTES",
                                           "data": ["a"]}]}, "2 elements"),
    ("/v2/models/tiny/infer", {"inputs": [{"name": "input_ids", "shape": [1], "datatype": "FP32",
                                           "data": [1.5]}]}, "datatype")])
def test_v2_validation_errors(srv, path, body, needle):
    r = srv.post(path, body)
    assert r.status_code == 422 and set(r.json()) == {"error"} and needle in r.json()["error"], r.text

"""TGI's Messages API serves whatever model it runs: huggingface_hub's InferenceClient.chat_completion sends
no ``model``, or a placeholder: ``"tgi"`` (older versions) or ``"dummy"`` (2.x); /v1/chat/completions gives
each the default model (the first ModelConfig) instead of a 404. /v1/completions still needs a model (OpenAI's rule)."""
from __future__ import annotations

import pytest
from huggingface_hub import InferenceClient

from tests.server_utils import ServerProcess, plain_server

MSGS = [{"role": "user", "content": "River mountain city garden"}]


@pytest.fixture(scope="module")
def srv(request, tiny_model) -> ServerProcess:
    return plain_server(request, tiny_model)


def test_inference_client_without_model_gets_the_default_model(srv, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "is_offline_mode", lambda: False)  # a local server, not the hub
    out = InferenceClient(base_url=srv.url()).chat_completion(MSGS, max_tokens=4, temperature=0)
    assert out.model == "tiny" and out.choices[0].finish_reason == "length"
    assert isinstance(out.choices[0].message.content, str)


@pytest.mark.parametrize("model", [None, "tgi", "dummy"])
def test_no_model_or_tgi_is_the_default_model(srv, model):
    body = {"messages": MSGS, "max_tokens": 3, "temperature": 0}
    if model is not None:
        body["model"] = model
    r = srv.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    want = srv.post("/v1/chat/completions", {**body, "model": "tiny"}).json()
    assert r.json()["model"] == "tiny" and r.json()["choices"][0]["message"] == want["choices"][0]["message"]


def test_completions_still_need_a_model(srv):
    r = srv.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert srv.post("/v1/chat/completions", {"model": "nope", "messages": MSGS}).status_code == 404


def test_a_model_that_is_not_a_string_is_still_a_400(srv):
    for model in ({}, [], 3):
        r = srv.post("/v1/chat/completions", {"model": model, "messages": MSGS})
        assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text

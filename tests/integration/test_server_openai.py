"""The OpenAI routes with the real, unmodified `openai` client: completions and chat, stream and non-stream,
n=2, logprobs, include_usage, greedy output token-identical to transformers with the same chat template,
usage counts; OpenAI's error shape; the catalog's /v1/models with an adapter as a child of its model."""
from __future__ import annotations

from pathlib import Path

import openai
import pytest
import requests
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mindie_service.devkit.lora import build_demo_lora
from tests.server_utils import ServerProcess, shared_server, write_config

pytestmark = pytest.mark.slow
MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "River mountain city garden"}]


@pytest.fixture(scope="module")
def srv(request, tiny_model, tmp_path_factory) -> ServerProcess:
    lora = build_demo_lora(str(tiny_model), str(tmp_path_factory.mktemp("oa-lora") / "ad"), rank=4, seed=1)

    def make(tmp: Path) -> ServerProcess:
        (tmp / "models").mkdir()
        cfg = write_config(tmp / "config.json", tiny_model, server={"openAiSupport": "vllm"}, deploy={
            "maxLoras": 2, "maxLoraRank": 16, "modelsDir": str(tmp / "models"),
            "LoraModules": [{"name": "ad", "path": str(lora), "baseModelName": "tiny"}]})
        return ServerProcess(cfg, tmp / "server.log")
    return shared_server("openai", request, make)


@pytest.fixture(scope="module")
def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url() + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def reference(tiny_model):
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).eval()

    def greedy(ids: list[int], n: int) -> list[int]:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                                 pad_token_id=tok.pad_token_id)
        return out[0, len(ids):].tolist()
    return tok, greedy


def test_chat_greedy_matches_transformers_with_the_chat_template(client, reference):
    tok, greedy = reference
    ids = tok.apply_chat_template(MSGS, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if not isinstance(ids, list) else ids)
    want = greedy(ids, 10)
    r = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=10, temperature=0,
                                       logprobs=True, top_logprobs=2)
    c = r.choices[0]
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == len(c.logprobs.content) == 10 and r.usage.total_tokens == len(ids) + 10
    got_text = "".join(t.token for t in c.logprobs.content)
    assert got_text == tok.decode(want) and c.message.content == tok.decode(want, skip_special_tokens=True)
    assert c.finish_reason == "length" and c.message.role == "assistant"
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
               for t in c.logprobs.content)
    # greedy: the chosen token is the most likely one
    assert all(t.top_logprobs[0].token == t.token for t in c.logprobs.content)

    stream = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=10, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == len(ids)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == c.message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"


def test_completions_n2_logprobs_echo_and_a_list_of_prompts(client, reference):
    tok, greedy = reference
    prompt = "River mountain city garden"
    ids = tok(prompt).input_ids
    want_ids = greedy(ids, 6)
    want = tok.decode(want_ids).rstrip("\ufffd")  # an incomplete UTF-8 character at the end is held back
    r = client.completions.create(model="tiny", prompt=[prompt, "Hello"], max_tokens=6, temperature=0, n=2,
                                  logprobs=3)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text == want  # greedy: both choices the same
    assert r.choices[0].logprobs.tokens == [tok.decode([t]) for t in want_ids]
    assert all(len(c.logprobs.tokens) == 6 and len(c.logprobs.top_logprobs[0]) == 3 for c in r.choices)
    assert r.usage.prompt_tokens == len(ids) + len(tok("Hello").input_ids)  # once per prompt, not per choice
    assert r.usage.completion_tokens == 24
    echo = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0, echo=True)
    assert echo.choices[0].text == prompt + want
    default = client.completions.create(model="tiny", prompt=prompt, temperature=0)
    assert default.usage.completion_tokens == 16  # OpenAI's default max_tokens on completions

    sampled = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, n=2, seed=7, temperature=1.0,
                                        stream=True, stream_options={"include_usage": True})
    texts = {0: "", 1: ""}
    usage = None
    for ch in sampled:
        for c in ch.choices:
            texts[c.index] += c.text
        usage = ch.usage or usage
    assert usage is not None and usage.completion_tokens == 16 and texts[0] and texts[1]


def test_errors_have_openais_shape(srv, client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="no-such-model", prompt="x")
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MSGS, temperature=2.5)
    assert e.value.body["param"] == "temperature"
    r = requests.post(srv.url() + "/v1/completions", json={"model": "tiny", "prompt": "x", "presence_penalty": 5})
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = requests.post(srv.url() + "/v1/chat/completions", data=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "error" in r.json() and "message" in r.json()["error"]
    assert srv.get("/health", "management").status_code == 200


def test_vllm_fields_and_an_adapter_by_name(srv, client):
    listed = {m.id: m for m in client.models.list().data}
    assert "tiny" in listed and listed["ad"].model_extra["parent"] == "tiny"
    base = client.completions.create(model="tiny", prompt="River mountain", max_tokens=8, temperature=0,
                                     extra_body={"ignore_eos": True, "top_k": 5})
    with_ad = client.completions.create(model="ad", prompt="River mountain", max_tokens=8, temperature=0,
                                        extra_body={"ignore_eos": True})
    assert base.usage.completion_tokens == with_ad.usage.completion_tokens == 8
    assert base.choices[0].text != with_ad.choices[0].text  # the adapter changes the output
    assert with_ad.model == "ad"

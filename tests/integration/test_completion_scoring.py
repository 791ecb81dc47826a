"""Prompt scoring on /v1/completions (OpenAI's legacy echo + logprobs) against transformers on the tiny demo
model, and vLLM's tokenizer routes (/tokenize, /detokenize, /tokenizer_info) against its tokenizer."""
from __future__ import annotations

import json

import pytest
import requests
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.server_utils import ServerProcess, plain_server

TEXT = "River mountain city garden"
TOL = 1e-4  # fp32 on both sides; the engine's paged attention and C GEMM differ from torch's in rounding only


@pytest.fixture(scope="module")
def srv(request, tiny_model) -> ServerProcess:
    return plain_server(request, tiny_model)


@pytest.fixture(scope="module")
def hf(tiny_model):
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).eval()

    def logprobs(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0].float().log_softmax(-1)  # row p predicts token p + 1
    return tok, logprobs


def test_echo_with_max_tokens_0_scores_the_prompt_as_transformers_does(srv, hf):
    tok, logprobs = hf
    ids = tok(TEXT).input_ids  # a text prompt: the tokenizer adds its BOS
    r = srv.post("/v1/completions", {"model": "tiny", "prompt": TEXT, "echo": True, "logprobs": 3, "max_tokens": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    c = body["choices"][0]
    lp = c["logprobs"]
    assert c["text"] == TEXT and c["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)}
    assert len(lp["tokens"]) == len(ids)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # as OpenAI: nothing predicts it
    ref = logprobs(ids)
    for p in range(1, len(ids)):
        assert abs(lp["token_logprobs"][p] - ref[p - 1, ids[p]].item()) < TOL
        top = ref[p - 1].topk(3)
        want = {tok.convert_tokens_to_string([tok.convert_ids_to_tokens(i)]): v
                for i, v in zip(top.indices.tolist(), top.values.tolist())}
        got = lp["top_logprobs"][p]
        assert len(got) == 3 and set(got) == set(want)
        assert all(abs(got[k] - want[k]) < TOL for k in want)
    # text_offset counts the returned text's characters: the BOS it does not spell takes none
    offsets = lp["text_offset"]
    assert offsets[0] == 0 and offsets[1] == 0
    assert "".join(lp["tokens"][1:]) == c["text"]
    assert offsets[1:] == [len("".join(lp["tokens"][1:p])) for p in range(1, len(ids))]


def test_lm_eval_form_token_prompt_max_tokens_1(srv, hf):
    """What lm-eval's local-completions sends: token ids, echo, logprobs 1, max_tokens 1; it reads
    token_logprobs[ctxlen:-1] and checks each against max(top_logprobs[...]) for is_greedy."""
    tok, logprobs = hf
    ctx, cont = tok("The garden", add_special_tokens=False).input_ids, tok(" river", add_special_tokens=False).input_ids
    ids = ctx + cont
    r = srv.post("/v1/completions", {"model": "tiny", "prompt": [ids], "echo": True, "logprobs": 1, "max_tokens": 1,
                                     "temperature": 0, "seed": 1234})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == len(ids) + 1  # the prompt, then the one generated token
    ref = logprobs(ids)
    want = sum(ref[p - 1, ids[p]].item() for p in range(len(ctx), len(ids)))
    got = sum(lp["token_logprobs"][len(ctx):-1])
    assert abs(got - want) < TOL * len(cont)
    for p, (t, top) in enumerate(zip(lp["token_logprobs"][len(ctx):-1], lp["top_logprobs"][len(ctx):-1]),
                                 start=len(ctx)):
        is_greedy = t == max(top.values())  # lm-eval's exact comparison: both come from one log-softmax
        assert len(top) == 1 and is_greedy == (ref[p - 1].argmax().item() == ids[p])


def test_max_tokens_0_streams_the_echo_only_and_needs_echo(srv):
    r = srv.post("/v1/completions", {"model": "tiny", "prompt": TEXT, "echo": True, "logprobs": 0, "max_tokens": 0,
                                     "stream": True}, stream=True)
    lines = [ln[5:].strip() for ln in r.iter_lines() if ln.startswith(b"data:")]
    assert lines[-1] == b"[DONE]"
    frames = [json.loads(ln) for ln in lines[:-1]]
    texts = "".join(f["choices"][0]["text"] for f in frames if f.get("choices"))
    assert texts == TEXT
    assert frames[-1]["choices"][0]["finish_reason"] == "length"
    bad = srv.post("/v1/completions", {"model": "tiny", "prompt": TEXT, "max_tokens": 0})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
    assert "echo" in bad.json()["error"]["message"]


def test_text_offset_of_generated_tokens_follows_the_echoed_text(srv):
    r = srv.post("/v1/completions", {"model": "tiny", "prompt": TEXT, "echo": True, "logprobs": 1, "max_tokens": 4,
                                     "temperature": 0}).json()
    c = r["choices"][0]
    lp = c["logprobs"]
    n_prompt = r["usage"]["prompt_tokens"]
    assert lp["text_offset"][n_prompt] == len(TEXT)  # the first generated token starts right after the echo
    assert all(o <= len(c["text"]) for o in lp["text_offset"])


# -- vLLM's tokenizer routes ---------------------------------------------------------------------------
def test_tokenize_detokenize_and_tokenizer_info_in_vllm_shapes(srv, hf):
    tok, _ = hf
    r = srv.post("/tokenize", {"prompt": TEXT, "add_special_tokens": False}).json()
    assert r["tokens"] == tok(TEXT, add_special_tokens=False).input_ids
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == 512 and r["token_strs"] is None
    r = srv.post("/tokenize", {"model": "tiny", "prompt": TEXT, "return_token_strs": True}).json()
    assert r["tokens"] == tok(TEXT).input_ids and r["token_strs"] == tok.convert_ids_to_tokens(r["tokens"])
    msgs = [{"role": "user", "content": "hi"}]
    r = srv.post("/tokenize", {"messages": msgs}).json()
    want = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert r["tokens"] == tok(want, add_special_tokens=False).input_ids
    d = srv.post("/detokenize", {"tokens": tok(TEXT).input_ids}).json()
    assert d == {"prompt": tok.decode(tok(TEXT).input_ids)}
    info = srv.get("/tokenizer_info").json()
    assert (info["eos_token"], info["bos_token"], info["pad_token"]) == (tok.eos_token, tok.bos_token, tok.pad_token)
    assert info["chat_template"] == tok.chat_template and info["model_max_length"] == 512
    for path, body, param in [("/tokenize", {"prompt": 1}, "prompt"), ("/tokenize", {}, "prompt"),
                              ("/detokenize", {"tokens": [99999]}, "tokens"), ("/detokenize", {"tokens": "x"}, "tokens")]:
        bad = srv.post(path, body)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param, (path, bad.text)
    assert srv.post("/tokenize", {"prompt": "x", "model": "nope"}).status_code == 404


def test_lm_eval_detects_the_remote_tokenizer(srv, hf):
    from lm_eval.utils import RemoteTokenizer, check_remote_tokenizer_support

    tok, _ = hf
    url = srv.url() + "/v1/completions"
    assert check_remote_tokenizer_support(url)
    remote = RemoteTokenizer(url)
    assert remote.encode(TEXT) == tok(TEXT, add_special_tokens=False).input_ids
    assert remote.eos_token_id == tok.eos_token_id and remote.bos_token_id == tok.bos_token_id
    assert remote.decode(tok(TEXT).input_ids) == tok.decode(tok(TEXT).input_ids)
    msgs = [{"role": "user", "content": "hi"}]  # lm-eval renders the served template itself (jinja2)
    assert (remote.apply_chat_template(msgs, bos_token=remote.bos_token, eos_token=remote.eos_token)
            == tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False))

"""EOS over HTTP on the tiny-eos demo model: MindIE's `/` and TGI's routes report finish_reason eos_token,
stream and non-stream alike, with the offline engine's tokens and no EOS text in the output."""
from __future__ import annotations

from pathlib import Path

import pytest

from mindie_service import LLM, SamplingParams
from tests.prompts import word_prompts
from tests.server_utils import ServerProcess, shared_server, sse_frames, write_config

MAX = 40


@pytest.fixture(scope="module")
def eos_srv(request, tiny_eos_model):
    def make(tmp: Path) -> ServerProcess:
        return ServerProcess(write_config(tmp / "config.json", tiny_eos_model, model_name="tiny-eos"),
                             tmp / "server.log")
    return shared_server("eos", request, make)


@pytest.fixture(scope="module")
def offline(tiny_eos_model):
    """(prompt, token ids, text) of greedy runs that end on EOS before MAX tokens, from the offline engine."""
    llm = LLM(str(tiny_eos_model), cache_block_size=16, num_kv_blocks=256)
    outs = llm.generate(word_prompts(8, 3, 30, seed=5), SamplingParams(max_tokens=MAX, temperature=0.0),
                        use_tqdm=False)
    ended = [(o.prompt, o.outputs[0].token_ids, o.outputs[0].text) for o in outs
             if o.outputs[0].finish_reason == "eos_token" and len(o.outputs[0].token_ids) < MAX]
    assert len(ended) >= 2
    return ended


def test_root_reports_eos_token_with_the_offline_tokens(eos_srv, offline):
    for prompt, ids, text in offline:
        r = eos_srv.post("/", {"inputs": prompt, "parameters": {"max_new_tokens": MAX, "details": True}})
        assert r.status_code == 200, r.text
        out = r.json()[0]
        d = out["details"]
        assert d["finish_reason"] == "eos_token" and d["generated_tokens"] == len(ids) < MAX
        assert [t["id"] for t in d["tokens"]] == ids and out["generated_text"] == text and "</s>" not in text


def test_streams_end_with_eos_token(eos_srv, offline):
    prompt, ids, text = offline[0]
    frames = list(sse_frames(eos_srv.post("/", {"inputs": prompt, "stream": True,
                                                "parameters": {"max_new_tokens": MAX, "details": True}},
                                          stream=True)))
    assert frames[-1]["details"]["finish_reason"] == "eos_token" and frames[-1]["generated_text"] == text
    assert len(frames) == len(ids)
    tgi = list(sse_frames(eos_srv.post("/generate_stream", {"inputs": prompt, "parameters": {
        "max_new_tokens": MAX, "details": True}}, stream=True)))
    assert tgi[-1]["details"]["finish_reason"] == "eos_token" and [f["token"]["id"] for f in tgi] == ids

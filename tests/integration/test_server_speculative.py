"""Speculative decoding through the server (ModelConfig.plugin_params, MindIE's memory_decoding): greedy output
token-identical to the unspeculated offline engine on the 16-prompt parity set, whole and streamed (each
accepted run streamed as it is accepted: the frames concatenate to the whole text), and the vllm:spec_decode_*
counters on /metrics."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from mindie_service import LLM, SamplingParams
from tests.prompts import parity_prompts
from tests.server_utils import ServerProcess, shared_server, sse_frames, write_config

MAX = 24
PLUGIN = json.dumps({"plugin_type": "memory_decoding", "decoding_length": 4, "dynamic_algo": False})


@pytest.fixture(scope="module")
def spec_srv(request, tiny_model):
    def make(tmp: Path) -> ServerProcess:
        cfg = write_config(tmp / "config.json", tiny_model, deploy={
            "speculationGamma": 4,
            "ModelConfig": [{"modelName": "tiny", "modelWeightPath": str(tiny_model), "plugin_params": PLUGIN}]})
        return ServerProcess(cfg, tmp / "server.log")
    return shared_server("speculative", request, make)


@pytest.fixture(scope="module")
def offline(tiny_model):
    llm = LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=256)
    outs = llm.generate(parity_prompts(), SamplingParams(max_tokens=MAX, temperature=0.0, ignore_eos=True),
                        use_tqdm=False)
    return [(o.prompt, o.outputs[0].token_ids, o.outputs[0].text) for o in outs]


def _body(prompt: str, stream: bool = False) -> dict:
    return {"inputs": prompt, "stream": stream,
            "parameters": {"max_new_tokens": MAX, "details": True, "do_sample": False}}


def test_whole_and_streamed_output_match_the_unspeculated_engine(spec_srv, offline):
    for _ in range(2):  # the second round drafts from the first's text (memory decoding): long accepted runs
        for prompt, ids, text in offline:
            r = spec_srv.post("/", _body(prompt))
            assert r.status_code == 200, r.text
            out = r.json()[0]
            assert [t["id"] for t in out["details"]["tokens"]] == ids and out["generated_text"] == text
        for prompt, ids, text in offline[::3]:
            tgi = list(sse_frames(spec_srv.post("/generate_stream", _body(prompt, stream=True), stream=True)))
            assert [f["token"]["id"] for f in tgi] == ids
            assert "".join(f["token"]["text"] for f in tgi if not f["token"]["special"]) == text


def test_metrics_count_drafts(spec_srv, offline):
    for _ in range(2):  # the second drafts from the first's text (memory decoding), whatever ran before
        spec_srv.post("/", _body(offline[0][0]))
    body = requests.get(spec_srv.url("metrics") + "/metrics", timeout=10).text
    vals = {line.split(" ")[0].split("{")[0]: float(line.split(" ")[-1]) for line in body.splitlines()
            if line.startswith(("vllm:spec_decode", "spec_decode"))}
    assert vals["vllm:spec_decode_num_drafts_total"] > 0
    assert 0 < vals["vllm:spec_decode_num_accepted_tokens_total"] <= vals["vllm:spec_decode_num_draft_tokens_total"]
    assert vals["spec_decode_mean_accepted_length"] > 1.0

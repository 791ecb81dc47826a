"""Speculative decoding with a JSON schema through the server (MindIE's memory_decoding plugin, the shared
speculative server): greedy constrained output on the 16-prompt parity set token-identical to the unspeculated
offline engine, whole (`/`) and streamed (`/generate_stream`), every answer valid against its schema, and the
vllm:spec_decode_* counters move while only constrained requests run (constrained rows speculate)."""
from __future__ import annotations

import json

import jsonschema
import pytest
import requests

from mindie_service import LLM, SamplingParams
from tests.integration.test_server_speculative import spec_srv  # noqa: F401 - the shared speculative server
from tests.prompts import parity_prompts
from tests.server_utils import sse_frames

MAX = 60
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "count", "words"],
          "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]},
                         "count": {"type": "integer", "minimum": 0, "maximum": 999},
                         "words": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}}}


@pytest.fixture(scope="module")
def offline(tiny_model):
    llm = LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=256)
    outs = llm.generate(parity_prompts(), SamplingParams(max_tokens=MAX, temperature=0.0,
                                                         structured_outputs={"json": SCHEMA}), use_tqdm=False)
    return [(o.prompt, o.outputs[0].token_ids, o.outputs[0].text) for o in outs]


def _body(prompt: str, stream: bool = False) -> dict:
    return {"inputs": prompt, "stream": stream,
            "parameters": {"max_new_tokens": MAX, "details": True, "do_sample": False,
                           "grammar": {"type": "json", "value": SCHEMA}}}


def _counters(srv) -> dict[str, float]:
    body = requests.get(srv.url("metrics") + "/metrics", timeout=10).text
    return {line.split(" ")[0].split("{")[0]: float(line.split(" ")[-1]) for line in body.splitlines()
            if line.startswith("vllm:spec_decode")}


def test_constrained_whole_and_streamed_match_the_unspeculated_engine(spec_srv, offline):  # noqa: F811
    before = _counters(spec_srv)
    for _ in range(2):  # the second round drafts from the first's text (memory decoding)
        for prompt, ids, text in offline:
            r = spec_srv.post("/", _body(prompt))
            assert r.status_code == 200, r.text
            out = r.json()[0]
            assert [t["id"] for t in out["details"]["tokens"]] == ids and out["generated_text"] == text
            if out["details"]["finish_reason"] != "length":
                jsonschema.validate(json.loads(text), SCHEMA)
        for prompt, ids, text in offline[::3]:
            frames = list(sse_frames(spec_srv.post("/generate_stream", _body(prompt, True), stream=True)))
            assert [f["token"]["id"] for f in frames] == ids
            assert "".join(f["token"]["text"] for f in frames if not f["token"]["special"]) == text
    after = _counters(spec_srv)
    assert after["vllm:spec_decode_num_drafts_total"] > before.get("vllm:spec_decode_num_drafts_total", 0)
    assert (after["vllm:spec_decode_num_accepted_tokens_total"]
            > before.get("vllm:spec_decode_num_accepted_tokens_total", 0))

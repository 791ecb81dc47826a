"""EOS handling on a demo model that reaches EOS (preset tiny-eos): generation stops at the EOS token with
finish reason eos_token, exactly where transformers' greedy generate stops; ignore_eos runs on past it."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mindie_service import LLM, SamplingParams
from tests.prompts import word_prompts

MAX = 40


@pytest.fixture(scope="module")
def llm(tiny_eos_model):
    return LLM(str(tiny_eos_model), cache_block_size=16, num_kv_blocks=256)


@pytest.fixture(scope="module")
def prompts():
    return word_prompts(8, 3, 30, seed=5)


@pytest.fixture(scope="module")
def hf_outputs(tiny_eos_model, prompts):
    tok = AutoTokenizer.from_pretrained(tiny_eos_model)
    hf = AutoModelForCausalLM.from_pretrained(tiny_eos_model, dtype=torch.float32).eval()
    outs = []
    with torch.inference_mode():
        for p in prompts:
            ids = tok(p, return_tensors="pt").input_ids
            gen = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX, do_sample=False,
                              pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            outs.append(gen[0, ids.shape[1]:].tolist())
    return tok.eos_token_id, outs


def test_generation_stops_at_eos_where_transformers_does(llm, prompts, hf_outputs):
    eos, ref = hf_outputs
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX, temperature=0.0), use_tqdm=False)
    stopped = 0
    for o, want in zip(outs, ref):
        got = o.outputs[0]
        if want[-1] == eos:  # transformers stopped on EOS before the cap
            stopped += 1
            assert got.finish_reason == "eos_token" and got.token_ids == want
            assert eos not in got.token_ids[:-1]
        else:
            assert got.finish_reason == "length" and got.token_ids == want and eos not in want
    assert stopped >= len(prompts) // 2  # the preset really reaches EOS


def test_ignore_eos_generates_past_it_to_the_cap(llm, prompts, hf_outputs):
    eos, ref = hf_outputs
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX, temperature=0.0, ignore_eos=True), use_tqdm=False)
    for o, want in zip(outs, ref):
        got = o.outputs[0]
        assert got.finish_reason == "length" and len(got.token_ids) == MAX
        assert got.token_ids[:len(want)] == want  # the same tokens up to (and including) the EOS it ran past
    assert any(eos in o.outputs[0].token_ids[:-1] for o in outs)


def test_eos_text_is_not_in_the_output(llm, prompts, hf_outputs):
    eos, ref = hf_outputs
    i = next(k for k, w in enumerate(ref) if w[-1] == eos)
    out = llm.generate([prompts[i]], SamplingParams(max_tokens=MAX, temperature=0.0), use_tqdm=False)[0].outputs[0]
    assert "</s>" not in out.text

"""The engine is token-identical to Hugging Face transformers on the same weights (fp32, greedy)."""
from __future__ import annotations

import os
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mindie_service import LLM, SamplingParams
from npu_ops import cpu_kernels
from tests.prompts import word_prompts

MAX_TOKENS = 48


@pytest.fixture(scope="module")
def reference(tiny_model):
    """transformers' greedy output for 12 prompts of 3-120 words, 48 tokens each, EOS ignored."""
    tok = AutoTokenizer.from_pretrained(tiny_model)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    prompts = word_prompts(12, 3, 120, seed=1)
    shared = "Harbor lantern winter bridge orange violin forest letter museum thunder candle meadow " * 3
    prompts += [shared + p for p in word_prompts(4, 3, 20, seed=2)]
    outs = []
    with torch.inference_mode():
        for p in prompts:
            ids = tok(p, return_tensors="pt").input_ids
            gen = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                              min_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=tok.pad_token_id)
            outs.append(gen[0, ids.shape[1]:].tolist())
    return prompts, outs


@pytest.fixture(params=["kernels", "reference"])
def cpu_path(request, monkeypatch):
    """Run a test on the CPU fast paths (C kernels, packed linears) and again on the portable PyTorch path."""
    if request.param == "reference":
        monkeypatch.setenv("MINDIE_CPU_KERNELS", "0")
    cpu_kernels.load.cache_clear()
    if request.param == "kernels":
        # Skipped only without a C compiler; with one, a failed build fails here instead of quietly
        # becoming a second run of the reference path.
        if not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")):
            pytest.skip("no C compiler: the CPU kernels cannot be built")
        if cpu_kernels.switched_off():
            pytest.skip("MINDIE_CPU_KERNELS=0 in the environment")
        assert cpu_kernels.load() is not None, cpu_kernels.describe()
    yield request.param
    monkeypatch.undo()
    cpu_kernels.load.cache_clear()


def _greedy(llm: LLM, prompts: list[str]) -> list[list[int]]:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def test_reference_is_context_sensitive(reference):
    # Guard against a degenerate demo model that would hide attention bugs: outputs must differ.
    _, outs = reference
    assert len({tuple(o) for o in outs}) == len(outs)


def test_batched_greedy_matches_transformers(tiny_model, reference, cpu_path):
    prompts, ref = reference
    llm = LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=512, max_batch_size=32)
    if llm.engine.device_info.type == "cpu":
        kernels_on = cpu_path == "kernels" and cpu_kernels.load() is not None
        assert ("CPU kernels: on" in llm.engine.device_info.reason) == kernels_on
    assert _greedy(llm, prompts[:12]) == ref[:12]


def test_matches_transformers_under_preemption(tiny_model, reference, cpu_path):
    prompts, ref = reference
    # 40 blocks of 8 tokens cannot hold 12 sequences of up to ~200 tokens: the scheduler must preempt.
    llm = LLM(str(tiny_model), cache_block_size=8, num_kv_blocks=40, max_batch_size=12, max_seq_len=400,
              max_input_token_len=300, max_prefill_tokens=400)
    assert _greedy(llm, prompts[:12]) == ref[:12]
    assert llm.engine.stats().num_preemptions > 0
    assert llm.engine.stats().free_blocks == 40


def test_matches_transformers_with_shared_prefixes(tiny_model, reference, cpu_path):
    prompts, ref = reference
    llm = LLM(str(tiny_model), cache_block_size=4, num_kv_blocks=1024)
    # First run fills the prefix cache; the second (one prompt at a time) hits it.
    assert _greedy(llm, prompts[12:]) == ref[12:]
    for p, r in zip(prompts[12:], ref[12:]):
        assert _greedy(llm, [p]) == [r]
    assert llm.engine.blocks.prefix_hits > 0


def test_staggered_identical_requests_agree(tiny_model):
    llm = LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=256)
    eng = llm.engine
    from mindie_service.engine.contract import EngineRequest
    prompt = llm.tokenizer("River mountain city garden teacher window").input_ids
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    outs: dict[str, list[int]] = {}
    for i in range(4):  # each joins a running batch a few steps after the previous one
        eng.add_request(EngineRequest(f"r{i}", prompt, params))
        for _ in range(3):
            for ev in eng.step():
                outs.setdefault(ev.request_id, []).append(ev.token.id)
    while eng.has_work():
        for ev in eng.step():
            outs.setdefault(ev.request_id, []).append(ev.token.id)
    assert len(outs) == 4 and all(o == outs["r0"] for o in outs.values())

"""Quantized models end to end: teacher-forced agreement with fp32 over 4,096 corpus tokens (the issue's
bar), the engine serving w8a16 / w8a8 / int8 KV, and LoRA applied in full precision on a quantized base."""
from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoTokenizer

from mindie_service import LLM, SamplingParams
from mindie_service.devkit.lora import build_demo_lora
from mindie_service.engine.configs.engine_config import LoraModuleSpec
from mindie_service.models.loader import load_model
from mindie_service.devkit.quant_eval import evaluate
from npu_ops.quant import QuantLinear

logger = logging.getLogger(__name__)

# scheme -> lowest top-1 agreement with fp32 (issue #18)
BARS = {"w8a16": 0.99, "w8a8": 0.98, "int8-kv": 0.98, "w8a8+int8-kv": 0.98}


@pytest.mark.slow
def test_teacher_forced_agreement_with_fp32(tiny_model):
    results = evaluate(tiny_model, AutoTokenizer.from_pretrained(tiny_model), n_tokens=4096)
    for r in results:
        logger.info("%s", r)
        assert r.positions > 3500  # most positions count: the margin filter only drops near-ties
        assert r.top1_agreement >= BARS[r.scheme], r
        assert 0 <= r.mean_kl < 0.01 and r.mean_abs_logprob_drift < 0.1, r
    assert {r.scheme for r in results} == set(BARS)


def test_loader_swaps_linears_and_keeps_lm_head_float(tiny_model):
    model = load_model(tiny_model, "float32", torch.device("cpu"), 64, quantization="w8a8").model
    quantized = [n for n, m in model.named_modules() if isinstance(m, QuantLinear)]
    assert len(quantized) == 4 * model.dims.layers and not isinstance(model.lm_head, QuantLinear)
    assert all(m.qweight.numel() == 0 or m.qweight.dtype == torch.int8 for m in model.modules()
               if isinstance(m, QuantLinear))
    assert not any(p.dtype == torch.float32 and p.dim() == 2 and p.shape[0] != model.dims.vocab
                   for n, p in model.named_parameters() if "proj" in n)  # no float copy of a projection left


def test_engine_serves_every_scheme(tiny_model):
    prompts = ["the little fox ran to the river", "User: what is two plus two?\nAssistant:"]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    base = [o.outputs[0].token_ids for o in LLM(str(tiny_model), num_kv_blocks=64, cache_block_size=16)
            .generate(prompts, params, use_tqdm=False)]
    for q, kv in (("w8a16", "auto"), ("w8a8", "auto"), (None, "int8"), ("w8a8", "int8")):
        llm = LLM(str(tiny_model), quantization=q, kv_cache_dtype=kv, num_kv_blocks=64, cache_block_size=16)
        pool = llm.engine.runner.kv_caches[0][0]
        assert pool.dtype == (torch.int8 if kv == "int8" else torch.float32)
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert all(len(g) == 12 for g in got)
        # greedy output follows fp32 at least for its first tokens (near-ties may fork it later)
        assert all(g[:3] == b[:3] for g, b in zip(got, base)), (q, kv, got, base)


def test_lora_applies_in_full_precision_on_a_quantized_base(tiny_model, tmp_path):
    adapter = str(build_demo_lora(str(tiny_model), str(tmp_path / "a"), rank=8, seed=3))
    prompts = ["the little fox ran to the river and", "once upon a time in"]
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)

    def run(q: str | None, adapter_id: str | None) -> list[list[int]]:
        llm = LLM(str(tiny_model), quantization=q, num_kv_blocks=64, cache_block_size=16,
                  lora_modules=(LoraModuleSpec("a", adapter),))
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False, adapter_id=adapter_id)]

    fp_lora, q_lora, q_base = run(None, "a"), run("w8a16", "a"), run("w8a16", None)
    assert q_lora != q_base  # the adapter has its effect on the quantized model
    assert all(a[:4] == b[:4] for a, b in zip(q_lora, fp_lora))  # and the same effect as on fp32


def test_bfloat16_model_runs_the_reference_not_the_fp32_kernels(tiny_model):
    model = load_model(tiny_model, "bfloat16", torch.device("cpu"), 64, quantization="w8a16").model
    mods = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert mods and all(m.path == "reference" for m in mods)
    x = torch.randn(3, mods[0].in_features, dtype=torch.bfloat16)
    assert mods[0](x).dtype == torch.bfloat16

"""Loading SmolLM2-135M-Instruct's .gguf: what was done to each tensor type is reported, and every linear
layer runs on the packed CPU GEMM (the fp32 error-bound self-check accepts a correct kernel on real weights)."""
from __future__ import annotations

import pytest

from npu_ops import cpu_kernels
from npu_ops.linear import FastLinear


def test_every_real_linear_is_packed(smollm_llm):
    if cpu_kernels.switched_off():
        pytest.skip("CPU fast paths switched off")
    mods = {n: m for n, m in smollm_llm.engine.model.named_modules() if isinstance(m, FastLinear)}
    assert len(mods) == 30 * 4 + 1
    assert [n for n, m in mods.items() if m.packed is None] == []


def test_the_load_reports_what_it_did_to_each_tensor_type(smollm_llm):
    engine = smollm_llm.engine
    assert engine.architecture == "LlamaForCausalLM"
    assert engine.hf_config.tie_word_embeddings and engine.hf_config.num_key_value_heads == 3
    assert engine.model.weights_report == {"F32": "61 tensors: kept",
                                           "Q4_1": "210 tensors: dequantized from Q4_1 at load",
                                           "Q8_0": "1 tensors: dequantized from Q8_0 at load"}

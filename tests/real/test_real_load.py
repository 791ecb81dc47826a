"""Loading SmolLM2-135M-Instruct's .gguf: its Q4_1 linears, its Q8_0 embeddings and the head tied to them stay as
the file stores them (models/gguf_packed.py, issue 44), the load reports what it did to each tensor type and to
each quantized tensor, and the tied head reads the embeddings' bytes (no second copy)."""
from __future__ import annotations

import pytest

from npu_ops import cpu_kernels
from npu_ops.gguf_modules import GgufEmbedding, GgufLinear


def test_every_real_linear_serves_from_its_q4_1_blocks(smollm_llm):
    if cpu_kernels.switched_off():
        pytest.skip("CPU fast paths switched off")
    m = smollm_llm.engine.model
    mods = {n: mod for n, mod in m.named_modules() if isinstance(mod, GgufLinear)}
    assert len(mods) == 30 * 4 + 1
    assert {tuple(mod.kinds) for n, mod in mods.items() if n != "lm_head"} == {("Q4_1x4",)}  # rows 4 interleaved
    assert all(mod.packed is not None for mod in mods.values())  # on the C kernels
    assert isinstance(m.embed_tokens, GgufEmbedding) and m.lm_head.parts[0] is m.embed_tokens.weight_q


def test_the_load_reports_what_it_did_to_each_tensor_type(smollm_llm):
    engine = smollm_llm.engine
    assert engine.architecture == "LlamaForCausalLM"
    assert engine.hf_config.tie_word_embeddings and engine.hf_config.num_key_value_heads == 3
    report = engine.model.weights_report
    if cpu_kernels.switched_off():
        assert report["Q4_1"] == "210 tensors: dequantized from Q4_1 at load"
        return
    assert {k: v for k, v in report.items() if "." not in k} == {
        "F32": "61 tensors: kept", "Q4_1": "210 tensors: kept packed", "Q8_0": "1 tensors: kept packed",
        "GGUF activations": "fp32 (weights dequantized in registers: the dequantized reference's values)"}
    assert report["blk.0.attn_q.weight"] == "Q4_1: kept packed" and report["token_embd.weight"] == "Q8_0: kept packed"
    assert len(report) == 4 + 211

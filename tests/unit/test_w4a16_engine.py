"""``quantization: w4a16`` (npu_ops.quant_w4a16.quantize_rtn: round to nearest, groups of 128, asymmetric, scales of
7 significant bits: Q4_1 blocks) on the tiny model with its MLP cut to whole groups: greedy decoding equals transformers on the same weights
dequantized, the weights' error is what round-to-nearest gives, and the engine's paths over int4 weights (the fused
one-call decode step, multi-step bursts, speculation, LoRA) keep the op-by-op tokens: the checks test_gguf_engine
runs on GGUF blocks (tests/packed_checks.py; LoRA on a W4A16 checkpoint against the same file dequantized at load)."""
from __future__ import annotations

import functools

import pytest
import torch
from safetensors.torch import load_file, save_file

from mindie_service import LLM
from mindie_service.devkit import w4a16_writer
from mindie_service.devkit.lora import build_demo_lora
from npu_ops import cpu_kernels, quant_w4a16
from npu_ops.gguf_modules import GgufLinear
from tests import packed_checks
from tests.unit.test_w4a16_load import POOL, PROMPTS, _hf_greedy, tiny256  # noqa: F401 - the fixture

pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def w4_llm(tiny256):  # noqa: F811
    return LLM(str(tiny256), dtype="float32", quantization="w4a16", **POOL)


def test_w4a16_requantizes_at_load_and_decodes_as_transformers_on_the_dequantized_weights(tiny256, w4_llm,  # noqa: F811
                                                                                         tmp_path):
    m = w4_llm.engine.runner.model
    assert m.layers[0].self_attn.qkv_proj.kinds == ["Q4_1x4"] and m.layers[3].mlp.down_proj.kinds == ["Q4_1x4"]
    assert not isinstance(m.lm_head, GgufLinear)  # the head stays float
    assert m.weights_report["W4A16"] == ("16 linears requantized at load (round to nearest, groups of 128, "
                                         "asymmetric): kept int4 as Q4_1")
    ref = tmp_path / "ref"
    ref.mkdir()
    for f in tiny256.iterdir():
        if f.suffix != ".safetensors":
            (ref / f.name).write_bytes(f.read_bytes())
    sd = load_file(str(tiny256 / "model.safetensors"))
    rel = []
    for k, v in sd.items():
        if k.rpartition(".")[0].rpartition(".")[2] in LINEARS:
            sd[k] = quant_w4a16.quantize_rtn(v).dequantize()
            rel.append(float((sd[k] - v).norm() / v.norm()))
    save_file(sd, str(ref / "model.safetensors"))
    assert 0.05 < max(rel) < 0.12  # round to nearest in 4 bits: about 0.1 of a Gaussian weight's norm
    assert [t for t, _ in packed_checks.generate(w4_llm, PROMPTS)] == _hf_greedy(ref)


def test_the_fused_decode_step_gives_the_op_by_op_logits(w4_llm, monkeypatch):
    packed_checks.fused_step_is_op_by_op(w4_llm, PROMPTS, monkeypatch)


def test_bursts_and_speculation_keep_the_tokens(tiny256, w4_llm):  # noqa: F811
    packed_checks.bursts_and_speculation_keep_the_tokens(
        functools.partial(LLM, str(tiny256), dtype="float32", quantization="w4a16", **POOL), PROMPTS, plain=w4_llm)


def test_lora_adds_its_delta_after_the_int4_matmul(tiny256, tmp_path, monkeypatch):  # noqa: F811
    """On a W4A16 checkpoint (msModelSlim's fp32 scales: Q4_1F blocks) against the same file dequantized at load."""
    adapter = str(build_demo_lora(str(tiny256), str(tmp_path / "lora"), rank=8, seed=3))
    w4 = w4a16_writer.write(tiny256, tmp_path / "w4", "msmodelslim", 128, True, torch.float32)
    packed = packed_checks.lora_after_the_packed_matmul(str(w4), adapter, PROMPTS, POOL, monkeypatch)
    assert packed.engine.runner.model.layers[0].mlp.down_proj.kinds == ["Q4_1Fx4"]

"""GGUF's Q5_0 and Q5_1 kept as stored (npu_ops/quant_gguf_q5.py; csrc/gemm_gguf_q5.c, csrc/gemm_gguf_q5_q8.c), the
types llama.cpp writes where a width is not whole 256-value super-blocks (most of SmolLM2-360M's "Q4_K_M"). The
PyTorch dequantizers and the C row kernels equal ``gguf.quants.dequantize`` bit for bit; the fp32-activation matmuls
agree with ``x @ dequantize(W).T`` within an fp32 GEMM's error bound (npu_ops.linear.fp32_gemm_tolerance), the
int8-activation ones with ``quant_gguf.matmul_q8_ref`` within 1e-6 of |x_q| . |W| (exact integer block sums); a
row's result is the same bits at any row count and thread split. A small random Llama written in Q5_0 and in Q5_1
by the gguf package's writer loads with every linear, the embeddings and the tied head packed, and its
teacher-forced log-probs equal the file dequantized at load within fp32 order (top-1 agreement 1.0). The engine on
the demo tiny model in Q5_0 / Q5_1: the fused one-call decode step gives the op-by-op step's tokens and log-probs bit
for bit, multi-step bursts and n-gram speculation keep the tokens, on fp32 and on int8 activations; a LoRA adapter added
after the packed matmul matches the same adapter over the file dequantized at load."""
from __future__ import annotations

import functools
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from mindie_service import LLM
from mindie_service.devkit.lora import build_demo_lora
from mindie_service.models.loader import load_model
from npu_ops import cpu_kernels, gguf_cpu
from npu_ops.gguf_modules import (INT8_ALL, INT8_DECODE, STEP_DECODE, STEP_PREFILL, GgufEmbedding, GgufLinear,
                                  gguf_step)
from npu_ops.linear import within_fp32_gemm_error
from npu_ops.quant_gguf import GgufWeight, block_type, matmul_q8_ref, matmul_ref, quantize_q8
from tests import packed_checks
from tests.gguf_files import write_gguf
from tests.unit.test_gguf_engine import POOL, PROMPTS
from tests.unit.test_gguf_packed_load import LAYERS, TOKENS, write_model
from tests.unit.test_gguf_q8 import activations, at_threads

KINDS = ("Q5_0", "Q5_1")
T = gguf.GGMLQuantizationType
pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")


def random_weight(kind: str, n: int, k: int, seed: int = 0) -> GgufWeight:
    """Random quant and fifth-bit bytes, random fp16 scales of both signs over 4 decades (and Q5_1 mins)."""
    bt = block_type(kind)
    assert bt is not None and bt.kernel is not None
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n, k // 32, bt.block_bytes), dtype=np.uint8)
    scales = rng.choice([-1, 1], size=raw.shape[:2]) * 10.0 ** rng.uniform(-4, 0, size=raw.shape[:2])
    raw[..., 0:2] = scales.astype(np.float16)[..., None].view(np.uint8)
    if kind == "Q5_1":
        raw[..., 2:4] = rng.normal(0, 0.05, size=raw.shape[:2]).astype(np.float16)[..., None].view(np.uint8)
    return GgufWeight(torch.from_numpy(raw.reshape(n, -1).copy()), kind, (n, k))


def gguf_dequantized(w: GgufWeight) -> torch.Tensor:
    return torch.from_numpy(np.asarray(gguf.quants.dequantize(w.data.numpy(), T[w.kind]), dtype=np.float32))


def q8_bound(x: torch.Tensor, w: GgufWeight) -> torch.Tensor:
    return 1e-6 * (quantize_q8(x, 16).abs() @ w.dequantize().abs().T)


@pytest.mark.parametrize("kind", KINDS)
def test_the_dequantizers_and_row_kernels_equal_gguf_quants_bit_for_bit(kind):
    w = random_weight(kind, 7, 160, seed=1)
    want = gguf_dequantized(w)
    assert torch.equal(w.dequantize(), want)
    assert torch.equal(w.rows(torch.tensor([5, 0, 5])), want[[5, 0, 5]])
    for r in range(7):
        assert torch.equal(gguf_cpu.dequantize_row(w, r), want[r])
    x = np.random.default_rng(2).normal(size=(4, 64)).astype(np.float32)  # what gguf's quantizer wrote
    q = GgufWeight(torch.from_numpy(np.ascontiguousarray(gguf.quants.quantize(x, T[kind]))), kind, (4, 64))
    assert (q.dequantize() - torch.from_numpy(x)).abs().max() < 0.15  # 5 bits of a unit normal


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,k,m", [(1, 32, 1), (7, 96, 1), (33, 320, 1), (5, 64, 2), (13, 96, 3), (29, 128, 7),
                                   (31, 96, 130)])
def test_the_fp32_and_int8_kernels_agree_with_their_references(kind, n, k, m):
    w, x = random_weight(kind, n, k, seed=n * k + m), activations(m, k, seed=m)
    assert within_fp32_gemm_error(gguf_cpu.matmul(x, w), matmul_ref(x, w), x, w.dequantize())
    got, want = gguf_cpu.matmul(x, w, int8_rows=True), matmul_q8_ref(x, w)
    assert ((got - want).abs() <= q8_bound(x, w)).all(), float(((got - want).abs() / q8_bound(x, w)).max())


@pytest.mark.parametrize("kind", KINDS)
def test_the_int8_gemm_chunks_and_tails_agree_and_each_row_is_its_own(kind):
    """71 rows at k 4096 (chunks of 24 rows, 4-row tiles, 2- and 1-row tails): the reference within fp32 order, each
    row's bits the same alone, in any slice and at any thread split, for both kernels."""
    w, x = random_weight(kind, 10, 4096, seed=11), activations(71, 4096, seed=12)
    for int8 in (False, True):
        full = gguf_cpu.matmul(x, w, int8_rows=int8)
        for a, b in ((0, 1), (5, 6), (23, 27), (24, 30), (69, 71), (3, 58)):
            assert torch.equal(gguf_cpu.matmul(x[a:b], w, int8_rows=int8), full[a:b]), (int8, a, b)
        layer = GgufLinear([w])
        layer.int8_steps = INT8_ALL if int8 else 0
        layer.prefill_tiles = False  # the kernel's bits; prefill pieces' tiles: tests/unit/test_gguf_tiles.py
        for t in at_threads(1, 2, 3):
            assert torch.equal(layer(x), full) and torch.equal(layer(x[2:3]), full[2:3]), (int8, t)
    assert ((full - matmul_q8_ref(x, w)).abs() <= q8_bound(x, w)).all()


def test_int8_rows_cost_at_most_half_a_step_per_element():
    m, n, k = 3, 21, 512
    for kind in KINDS:
        w, x = random_weight(kind, n, k, seed=5), activations(m, k, seed=6)
        dense = w.dequantize()
        half_step = (x.abs().reshape(m, -1, 16).amax(-1) / 127 / 2).repeat_interleave(16, dim=1)
        err = (gguf_cpu.matmul(x, w, int8_rows=True) - matmul_ref(x, w)).abs()
        assert (err <= half_step @ dense.abs().T + 1e-6 * (x.abs() @ dense.abs().T)).all()


def test_a_linear_of_q5_and_q4_parts_takes_each_kernel_by_step_kind():
    parts = [random_weight("Q5_0", 9, 256, 1), random_weight("Q5_1", 6, 256, 2)]
    parts.append(GgufWeight(torch.from_numpy(np.ascontiguousarray(gguf.quants.quantize(
        np.random.default_rng(3).normal(size=(5, 256)).astype(np.float32), T.Q4_0))), "Q4_0", (5, 256)))
    bias = torch.randn(20)
    layer = GgufLinear(parts, bias)
    layer.int8_steps = INT8_DECODE
    layer.prefill_tiles = False  # the kernels' bits; prefill pieces' tiles: tests/unit/test_gguf_tiles.py
    x = activations(5, 256, seed=4)
    for step, int8 in ((STEP_DECODE, True), (STEP_PREFILL, False)):
        want = torch.cat([gguf_cpu.matmul(x, p, int8_rows=int8) for p in parts], dim=1) + bias
        with gguf_step(step):
            assert torch.equal(layer(x), want), step
    dense = layer.dequantized()
    assert within_fp32_gemm_error(layer(x), x @ dense.T + bias, x, dense, bias)


@pytest.mark.parametrize("kind", KINDS)
def test_a_q5_file_loads_packed_and_matches_the_dequantized_reference(tmp_path, kind):
    f = write_model(tmp_path / f"{kind}.gguf", T[kind])
    loaded = load_model(f, "float32", torch.device("cpu"), 128)
    packed_checks.all_packed(loaded.model)
    assert loaded.weights_report[kind] == f"{1 + 7 * LAYERS} tensors: kept packed"
    assert gguf_cpu.embeddable(kind)  # the one-call decode step reads its embedding rows
    packed_checks.matches_the_dequantized_load(f, TOKENS, 64, kind)


@pytest.fixture(scope="module")
def tiny_q5_gguf(tiny_model, tmp_path_factory):
    """The demo tiny model as a GGUF: linears in Q5_0, v projections and the embeddings in Q5_1 (a qkv of two
    segments; embedding rows by the Q5_1 row kernel), the head in Q5_0."""
    types = {"token_embd.weight": T.Q5_1, "output.weight": T.Q5_0}
    for b in range(4):
        types.update({f"blk.{b}.{n}.weight": T.Q5_0 for n in ("attn_q", "attn_k", "attn_output", "ffn_gate",
                                                               "ffn_up", "ffn_down")})
        types[f"blk.{b}.attn_v.weight"] = T.Q5_1
    return write_gguf(Path(tiny_model), tmp_path_factory.mktemp("gguf") / "tiny-q5.gguf", types)


@pytest.mark.parametrize("activations", ["fp32", "int8"])
def test_the_engine_runs_q5_fused_in_bursts_and_speculation(tiny_q5_gguf, monkeypatch, activations):
    make = functools.partial(LLM, str(tiny_q5_gguf), dtype="float32", gguf_activations=activations, **POOL)
    llm = make()
    m = llm.engine.runner.model
    assert isinstance(m.embed_tokens, GgufEmbedding) and m.lm_head.kinds == ["Q5_0"]
    assert m.layers[0].self_attn.qkv_proj.kinds == ["Q5_0", "Q5_1"]
    packed_checks.bursts_and_speculation_keep_the_tokens(make, PROMPTS, plain=llm)
    packed_checks.fused_step_is_op_by_op(llm, PROMPTS, monkeypatch)


def test_lora_adds_its_delta_after_the_packed_q5_matmul(tiny_model, tiny_q5_gguf, tmp_path, monkeypatch):
    adapter = str(build_demo_lora(str(tiny_model), str(tmp_path / "lora"), rank=8, seed=3))
    packed = packed_checks.lora_after_the_packed_matmul(str(tiny_q5_gguf), adapter, PROMPTS,
                                                        {**POOL, "gguf_activations": "fp32"}, monkeypatch)
    assert packed.engine.runner.model.layers[0].mlp.down_proj.kinds == ["Q5_0"]

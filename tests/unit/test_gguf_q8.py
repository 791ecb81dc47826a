"""GGUF blocks against int8 activations (csrc/gemm_gguf_q8.c: Q4_0, Q4_1, Q8_0 and our Q4_1F; the K-quants'
csrc/gemm_kquant_q8.c), and how a GgufLinear takes them (npu_ops/gguf_modules.py's int8_steps, csrc/gguf_linear.c's
fn_q8, by the step kind). The reference is ``quant_gguf.matmul_q8_ref``: x's rows quantized per 16 columns by
llama.cpp's Q8_0 rule (an fp32 scale, round-half-even), dequantized, times the dequantized W; the block sums are
exact integers, so the kernels differ from it only in the order of fp32 operations: within 1e-6 of |x_q| . |W|.
Against fp32 activations each x element is off by at most half its group's step."""
from __future__ import annotations

from typing import Iterator

import numpy as np
import pytest
import torch

from npu_ops import cpu_kernels, gguf_cpu
from npu_ops.gguf_modules import INT8_ALL, INT8_DECODE, STEP_DECODE, STEP_PREFILL, GgufLinear, gguf_step
from npu_ops.quant_gguf import BLOCK_TYPES, GgufWeight, matmul_q8_ref, matmul_ref, q8_columns, quantize_q8
from tests.unit.test_gguf_kquant import weights as kquant_weights

KINDS = ("Q4_0", "Q4_1", "Q8_0", "Q4_1F")
pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")


def random_weight(kind: str, n: int, k: int, seed: int = 0) -> GgufWeight:
    """Random quant bytes with random scales of both signs over 4 decades (and mins for Q4_1, Q4_1F)."""
    bt = BLOCK_TYPES[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n, k // 32, bt.block_bytes), dtype=np.uint8)
    scales = rng.choice([-1, 1], size=raw.shape[:2]) * 10.0 ** rng.uniform(-4, 0, size=raw.shape[:2])
    mins = rng.normal(0, 0.05, size=raw.shape[:2])
    if kind == "Q4_1F":
        raw[..., 0:4] = scales.astype(np.float32)[..., None].view(np.uint8)
        raw[..., 4:8] = mins.astype(np.float32)[..., None].view(np.uint8)
    else:
        raw[..., 0:2] = scales.astype(np.float16)[..., None].view(np.uint8)
        if kind == "Q4_1":
            raw[..., 2:4] = mins.astype(np.float16)[..., None].view(np.uint8)
    return GgufWeight(torch.from_numpy(raw.reshape(n, -1).copy()), kind, (n, k))


def at_threads(*counts: int) -> Iterator[int]:
    """Each count in turn as torch's (and so the kernels' team's) thread count; the caller's restored after."""
    threads = torch.get_num_threads()
    try:
        for t in counts:
            torch.set_num_threads(t)
            yield t
    finally:
        torch.set_num_threads(threads)


def int8_all_layer(w: GgufWeight) -> GgufLinear:
    """A linear over ``w`` that takes the int8 kernels in every step kind."""
    layer = GgufLinear([w])
    layer.int8_steps = INT8_ALL
    return layer


def activations(m: int, k: int, seed: int) -> torch.Tensor:
    """Rows with outliers and an all-zero block (its scale 0), as a model's hidden states have."""
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed))
    x[:, 3] *= 40.0
    x[0, :32] = 0.0
    return x


def q8_bound(x: torch.Tensor, w: GgufWeight) -> torch.Tensor:
    return 1e-6 * (quantize_q8(x, 16).abs() @ w.dequantize().abs().T)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,k,m", [(1, 32, 1), (7, 96, 1), (33, 320, 1), (5, 64, 2), (13, 2048, 3), (29, 128, 8),
                                   (6, 96, 17)])
def test_the_int8_kernel_agrees_with_its_reference(kind, n, k, m):
    w, x = random_weight(kind, n, k, seed=n * k + m), activations(m, k, seed=m)
    got, want = gguf_cpu.matmul(x, w, int8_rows=True), matmul_q8_ref(x, w)
    assert ((got - want).abs() <= q8_bound(x, w)).all(), float(((got - want).abs() / q8_bound(x, w)).max())


def test_the_reference_quantizes_as_llama_cpp_does():
    """Q8_0's rule with an fp32 scale: d = max|x| / 127, q = round-half-even(x / d); a zero group stays zero; the
    32-value types' kernels take groups of 16."""
    x = torch.tensor([[127.0, 0.5, 1.5, -2.5] + [0.0] * 28 + [0.0] * 32])
    q = quantize_q8(x, 32)
    assert q[0, :4].tolist() == [127.0, 0.0, 2.0, -2.0] and not q[0, 32:].any()
    assert q8_columns(BLOCK_TYPES["Q4_0"]) == 16
    x = torch.tensor([[127.0] + [0.5] * 15 + [1.27] + [0.0] * 15])  # the second 16 have a step of their own
    assert quantize_q8(x, 16)[0, 16].item() == pytest.approx(1.27) and quantize_q8(x, 32)[0, 16].item() == 1.0
    y = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    step = y.abs().reshape(3, 2, 32).amax(-1, keepdim=True) / 127
    assert ((quantize_q8(y, 32) - y).abs().reshape(3, 2, 32) <= step / 2 * (1 + 1e-4)).all()


@pytest.mark.parametrize("kind", KINDS)
def test_int8_rows_cost_at_most_half_a_step_per_element(kind):
    m, n, k = 3, 21, 512
    w, x = random_weight(kind, n, k, seed=5), activations(m, k, seed=6)
    dense = w.dequantize()
    half_step = (x.abs().reshape(m, -1, 16).amax(-1) / 127 / 2).repeat_interleave(16, dim=1)
    err = (gguf_cpu.matmul(x, w, int8_rows=True) - matmul_ref(x, w)).abs()
    assert (err <= half_step @ dense.abs().T + 1e-6 * (x.abs() @ dense.abs().T)).all()
    assert float(err.mean() / (x.abs() @ dense.abs().T).mean()) < 3e-3  # near llama.cpp's relative error


@pytest.mark.parametrize("kind", KINDS)
def test_a_rows_result_is_the_same_bits_at_any_row_count_and_thread_split(kind):
    w, x = random_weight(kind, 37, 256, seed=3), activations(9, 256, seed=4)
    full = gguf_cpu.matmul(x, w, int8_rows=True)
    for i in (0, 3, 8):  # alone, and in the second place of a pair of rows
        assert torch.equal(gguf_cpu.matmul(x[i:i + 1], w, int8_rows=True), full[i:i + 1])
    assert torch.equal(gguf_cpu.matmul(x[2:4], w, int8_rows=True), full[2:4])
    layer = int8_all_layer(w)
    for _ in at_threads(1, 2, 3):
        assert torch.equal(layer(x), full) and torch.equal(layer(x[2:3]), full[2:3])


@pytest.mark.parametrize("kind", KINDS)
def test_the_int8_gemm_agrees_with_its_reference_and_each_row_is_its_own(kind):
    """A prefill's GEMM: 71 rows of x at k 4096 (chunks of 24 rows, 4-row tiles, a 2-row and a 1-row tail) against
    the reference within fp32 order, and each row's bits the same alone, in any slice and at any thread split."""
    n, k, m = 10, 4096, 71
    w, x = random_weight(kind, n, k, seed=11), activations(m, k, seed=12)
    full = gguf_cpu.matmul(x, w, int8_rows=True)
    assert ((full - matmul_q8_ref(x, w)).abs() <= q8_bound(x, w)).all()
    for a, b in ((0, 1), (5, 6), (23, 27), (24, 30), (69, 71), (3, 58)):
        assert torch.equal(gguf_cpu.matmul(x[a:b], w, int8_rows=True), full[a:b]), (a, b)
    layer = int8_all_layer(w)
    for t in at_threads(1, 2, 3):
        assert torch.equal(layer(x), full), t


def test_a_linear_takes_the_int8_kernels_in_the_step_kinds_it_names_at_any_row_count():
    """Parts of every type, the K-quants' Q8_K kernels included (run inside gguf_linear.c's team: the calling thread
    alone): int8_steps INT8_DECODE (ggufActivations int8) gives each part's int8 kernel's bits in a decode step of
    any row count and the fp32 kernels' in a prefill piece (the default outside any gguf_step); INT8_ALL the int8
    kernels' in both; 0 the fp32 kernels' in both."""
    parts = [random_weight(kind, 8 + i, 256, seed=i) for i, kind in enumerate(KINDS)]
    parts.append(GgufWeight(kquant_weights(12, 256, "Q6_K", seed=7).reshape(12, -1).contiguous(), "Q6_K", (12, 256)))
    bias = torch.randn(sum(p.shape[0] for p in parts))
    layer = GgufLinear(parts, bias)
    layer.prefill_tiles = False  # fp32 prefill pieces on the packed kernels here; the tiles: test_gguf_tiles.py

    def want(x: torch.Tensor, int8: bool) -> torch.Tensor:
        return torch.cat([gguf_cpu.matmul(x, p, int8_rows=int8) for p in parts], dim=1) + bias

    for steps, decode, prefill in ((INT8_DECODE, True, False), (INT8_ALL, True, True), (0, False, False)):
        layer.int8_steps = steps  # the segment table is rebuilt
        for m in (1, 5, 40):
            x = activations(m, 256, seed=m)
            for t in at_threads(1, 2):
                with gguf_step(STEP_DECODE):
                    assert torch.equal(layer(x), want(x, decode)), (steps, m, t)
                with gguf_step(STEP_PREFILL):
                    assert torch.equal(layer(x), want(x, prefill)), (steps, m, t)
                assert torch.equal(layer(x), want(x, prefill)), (steps, m, t)  # no gguf_step: a prefill


def test_bad_calls_are_refused_before_the_kernel_reads_anything():
    w = random_weight("Q4_0", 4, 64)
    with pytest.raises(ValueError, match="against W"):
        gguf_cpu.matmul(torch.zeros(1, 96), w, int8_rows=True)


@pytest.mark.parametrize("kind", ("Q4_0", "Q4_1", "Q4_1F"))
def test_the_8_row_batch_kernel_gives_each_row_the_bits_of_the_few_row_passes_at_1_to_33_rows(kind):
    """From 4 rows of x on the 4-bit types run csrc/gemm_gguf_q4_q8.c (8 weight rows in lanes), below it
    gemm_gguf_q8.c's 4-row passes: every row count 1..33 (full and tail chunks, 21 weight rows: a short last group)
    gives each row the bits it has alone, within the reference's bound, at 1 and 2 threads."""
    w, x = random_weight(kind, 21, 320, seed=21), activations(33, 320, seed=22)
    alone = torch.cat([gguf_cpu.matmul(x[i:i + 1], w, int8_rows=True) for i in range(33)])
    assert ((alone - matmul_q8_ref(x, w)).abs() <= q8_bound(x, w)).all()
    for t in at_threads(1, 2):
        for m in range(1, 34):
            assert torch.equal(gguf_cpu.matmul(x[33 - m:], w, int8_rows=True), alone[33 - m:]), (t, m)

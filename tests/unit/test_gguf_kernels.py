"""GGUF's Q4_0, Q4_1 and Q8_0 blocks kept as stored (npu_ops/quant_gguf.py, csrc/gemm_gguf.c, csrc/gguf_linear.c):
the PyTorch dequantizers equal ``gguf.quants.dequantize`` bit for bit, so do the C row kernels, and the C matmuls
(fp32 activations, weights dequantized in registers) agree with ``x @ dequantize(W).T`` within an fp32 GEMM's
error bound (npu_ops.linear.fp32_gemm_tolerance) on random blocks with random scales, at decode and prefill row
counts and odd output sizes; a row's result does not depend on the tile, the row count or the thread split."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from npu_ops import cpu_kernels, gguf_cpu
from npu_ops.gguf_modules import STEP_DECODE, GgufLinear, gguf_step
from npu_ops.linear import within_fp32_gemm_error
from npu_ops.quant_gguf import BLOCK_TYPES, GgufWeight, matmul_ref

KINDS = ("Q4_0", "Q4_1", "Q8_0")
needs_kernels = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")


def random_weight(kind: str, n: int, k: int, seed: int = 0) -> GgufWeight:
    """Random blocks: random quant bytes, random fp16 scales of both signs and magnitudes (and Q4_1 mins)."""
    bt = BLOCK_TYPES[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n, k // bt.block_size, bt.block_bytes), dtype=np.uint8)
    scales = (rng.choice([-1, 1], size=raw.shape[:2]) * 10.0 ** rng.uniform(-4, 0, size=raw.shape[:2]))
    raw[..., 0:2] = scales.astype(np.float16)[..., None].view(np.uint8)
    if kind == "Q4_1":
        raw[..., 2:4] = rng.normal(0, 0.05, size=raw.shape[:2]).astype(np.float16)[..., None].view(np.uint8)
    return GgufWeight(torch.from_numpy(raw.reshape(n, -1).copy()), kind, (n, k))


@pytest.mark.parametrize("kind", KINDS)
def test_the_dequantizer_equals_gguf_quants_bit_for_bit(kind):
    w = random_weight(kind, 7, 96)
    want = gguf.quants.dequantize(w.data.numpy(), gguf.GGMLQuantizationType[kind])
    assert torch.equal(w.dequantize(), torch.from_numpy(np.asarray(want, dtype=np.float32)))
    idx = torch.tensor([5, 0, 5])
    assert torch.equal(w.rows(idx), w.dequantize()[idx])


@pytest.mark.parametrize("kind", KINDS)
def test_the_dequantizer_reads_what_gguf_quantize_wrote(kind):
    x = np.random.default_rng(1).normal(size=(4, 64)).astype(np.float32)
    raw = gguf.quants.quantize(x, gguf.GGMLQuantizationType[kind])
    w = GgufWeight(torch.from_numpy(np.ascontiguousarray(raw)), kind, (4, 64))
    assert (w.dequantize() - torch.from_numpy(x)).abs().max() < 0.3  # 4 bits of a unit normal


@needs_kernels
@pytest.mark.parametrize("kind", KINDS)
def test_the_c_row_kernel_gives_the_dequantized_row(kind):
    w = random_weight(kind, 3, 160, seed=2)
    for r in range(3):
        assert torch.equal(gguf_cpu.dequantize_row(w, r), w.dequantize()[r])


@needs_kernels
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,k,m", [(1, 32, 1), (7, 96, 1), (33, 320, 1), (5, 64, 2), (13, 96, 3), (29, 128, 7),
                                   (4, 32, 70), (31, 96, 130)])
def test_the_c_matmul_agrees_with_the_reference(kind, n, k, m):
    w = random_weight(kind, n, k, seed=n * k + m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    got, want = gguf_cpu.matmul(x, w), matmul_ref(x, w)
    assert within_fp32_gemm_error(got, want, x, w.dequantize())


@needs_kernels
@pytest.mark.parametrize("kind", KINDS)
def test_a_rows_result_is_the_same_bits_at_any_row_count_and_thread_split(kind):
    w = random_weight(kind, 37, 256, seed=3)
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(4))
    full = gguf_cpu.matmul(x, w)
    for i in (0, 4, 8):
        assert torch.equal(gguf_cpu.matmul(x[i:i + 1], w), full[i:i + 1])
    layer = GgufLinear([w])
    threads = torch.get_num_threads()
    try:
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            with gguf_step(STEP_DECODE):  # a prefill piece runs the tiles instead (tests/unit/test_gguf_tiles.py)
                assert torch.equal(layer(x), full) and torch.equal(layer(x[2:3]), full[2:3])
    finally:
        torch.set_num_threads(threads)


@needs_kernels
def test_a_linear_of_parts_in_different_types_with_a_bias():
    parts = [random_weight("Q4_0", 20, 64, 5), random_weight("Q8_0", 9, 64, 6), random_weight("Q4_1", 17, 64, 7)]
    bias = torch.randn(46)
    layer = GgufLinear(parts, bias)
    for m in (1, 6):
        x = torch.randn(m, 64, generator=torch.Generator().manual_seed(m))
        dense = layer.dequantized()
        want = x @ dense.T + bias
        assert within_fp32_gemm_error(layer(x), want, x, dense, bias)
        assert torch.equal(layer.reference(x), torch.nn.functional.linear(x, dense, bias))


def test_a_weight_whose_bytes_do_not_fit_its_shape_is_refused():
    with pytest.raises(ValueError, match="Q4_0 weight of shape"):
        GgufWeight(torch.zeros(2, 17, dtype=torch.uint8), "Q4_0", (2, 32))

"""int8 quantization rounds half to even, in the PyTorch references and in the C kernels, bit for bit:
the int8 KV cache's rows (npu_ops/quant_kv.py's ``quantize``; the fused decoder's ``kv_quantize_row_i8`` in
csrc/attention_int8.c, which quantizes each step's K/V in the loop) and the W8A8 activations' rows
(npu_ops/quant.py's ``quantize_rows``; csrc/quantize_rows.c, AVX2 lanes and the scalar tail).

The inputs are built to land exactly half-way between two integers: each row's scale is a random power of two
``s`` (its amax is ``127 * s``), so ``x / s`` is exact and ``(k + 0.5) * s`` divides to ``k + 0.5``. Python's
``round`` (half to even, in double precision) is the independent expectation for the reference; the kernels
are held to the reference byte for byte, on row lengths that are and are not a multiple of 8."""
from __future__ import annotations

import ctypes
import math
import random

import pytest
import torch

from npu_ops import cpu_kernels, quant, quant_kv

needs_kernel = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")
LENGTHS = [1, 7, 8, 9, 16, 37, 64, 65]


def half_way_rows(rows: int, d: int, seed: int) -> tuple[torch.Tensor, list[float]]:
    """[rows, d] fp32 rows, most values exactly half-way (k + 0.5 steps), the rest random; each row's scale a
    random power of two (its first value is the amax, 127 steps). Returns the rows and their scales."""
    rnd = random.Random(seed)
    out, scales = [], []
    for _ in range(rows):
        s = 2.0 ** rnd.randint(-12, 6)
        row = [127 * s * rnd.choice((1, -1))]
        for _ in range(d - 1):
            k = rnd.randint(-127, 126)
            row.append((k + 0.5) * s if rnd.random() < 0.7 else rnd.uniform(-127, 127) * s)
        rnd.shuffle(row)
        out.append(row[:d])
        scales.append(s)
    return torch.tensor(out, dtype=torch.float32), scales


def expected(x: torch.Tensor, scales: list[float]) -> list[list[int]]:
    return [[max(-127, min(127, round(v / s))) for v in row] for row, s in zip(x.tolist(), scales)]


def test_half_way_inputs_tell_the_two_roundings_apart():
    """Half to even and half away from zero differ on half of the half-way values (k + 0.5, k even: even is k)."""
    x, scales = half_way_rows(4, 64, 0)
    halves = [v / s for row, s in zip(x.tolist(), scales) for v in row if abs(v / s) % 1 == 0.5]
    away = [math.copysign(math.floor(abs(q) + 0.5), q) for q in halves]
    differ = sum(round(q) != a for q, a in zip(halves, away))
    assert len(halves) > 100 and 0 < differ < len(halves)


@pytest.mark.parametrize("d", LENGTHS)
def test_kv_reference_rounds_half_to_even(d):
    x, scales = half_way_rows(6, d, d)
    rows = quant_kv.quantize(x)
    assert rows[:, :d].tolist() == expected(x, scales)
    assert rows[:, d:].contiguous().view(torch.float32)[:, 0].tolist() == scales


def kernel_kv_rows(x: torch.Tensor) -> torch.Tensor:
    """Each row through the fused decoder's K/V quantizer (kv_quantize_row_i8), one call a row."""
    fn = cpu_kernels.load().kv_quantize_row_i8
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p], None
    x = x.contiguous()
    d = x.shape[-1]
    out = torch.zeros(x.shape[0], quant_kv.row_bytes(d), dtype=torch.int8)
    for i in range(x.shape[0]):
        fn(x[i].data_ptr(), d, out[i].data_ptr())
    return out


@needs_kernel
@pytest.mark.parametrize("d", LENGTHS)
def test_kv_kernel_is_the_reference_byte_for_byte(d):
    x, _ = half_way_rows(6, d, 100 + d)
    g = torch.Generator().manual_seed(d)
    noise = torch.randn(5, d, generator=g) * torch.rand(5, 1, generator=g) * 9  # random per-row scales
    zero = torch.zeros(1, d)
    x = torch.cat([x, noise, zero])
    assert torch.equal(kernel_kv_rows(x), quant_kv.quantize(x))


@pytest.mark.parametrize("d", LENGTHS)
def test_activation_reference_rounds_half_to_even(d):
    x, scales = half_way_rows(6, d, 200 + d)
    xq, xs = quant.quantize_rows(x)
    assert xq.tolist() == expected(x, scales) and xs.tolist() == scales


@needs_kernel
@pytest.mark.parametrize("d", LENGTHS)
def test_activation_kernel_is_the_reference_byte_for_byte(d):
    from npu_ops import quant_cpu
    x, _ = half_way_rows(9, d, 300 + d)
    xq, xs = quant_cpu.quantize_rows(x)
    rq, rs = quant.quantize_rows(x)
    assert torch.equal(xq[:, :d], rq) and torch.equal(xs, rs) and not xq[:, d:].any()

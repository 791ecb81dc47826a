"""GGUF K-quant weights (npu_ops/quant_gguf_kquant.py, npu_ops/csrc/gemm_kquant.c): the PyTorch dequantizers equal
``gguf.quants.dequantize`` bit for bit, the C kernels dequantize exactly those values (one-hot activations give W's
columns exactly, on both the few-rows and the buffered path), and their products agree with "dequantize, then fp32
matmul" to fp32 accumulation-order error: |y - ref| <= 1e-6 * (|x| @ |W|^T) elementwise (a sum of k products in
another order is off by at most about k * 2^-24 of that; 2048 * 6e-8 = 1.2e-4 is the worst case, random errors sit
near 1e-7). The int8-row kernels (``int8_rows=True``, llama.cpp's Q8_K activations) are held to their own
reference (the quantized rows times gguf's W) by the same 1e-6 of |x_q| @ |W|^T, and to the fp32 reference by the
rounding of x: at most half a quantization step per element.

``gguf.quants.quantize`` has no K-quant quantizer (it raises NotImplementedError for Q4_K, Q5_K and Q6_K), so the
blocks here come from ``kquantize`` below: llama.cpp's reference layout with its simplest scale choice (per
sub-block min/max for Q4_K and Q5_K, the largest magnitude mapped to -32 for Q6_K, the sub-block scales and mins
quantized against the super-block's fp16 d and dmin), applied to random fp32 matrices so the 6-bit scales and mins
vary as real files' do, plus blocks of random bytes (every bit pattern of the scales and quants)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from npu_ops import cpu_kernels, quant_gguf_kquant as kq

TYPES = ("Q4_K", "Q5_K", "Q6_K")
needs_kernels = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _quant_q45(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """[nb, 8, 32] -> (quants [nb, 8, 32] in 0..nmax, 6-bit scales and mins [nb, 8], d and dmin fp16 [nb])."""
    lo, hi = np.minimum(x.min(-1), 0.0), x.max(-1)
    scale, mins = (hi - lo) / nmax, -lo
    d = (scale.max(-1) / 63).astype(np.float16)
    dmin = (mins.max(-1) / 63).astype(np.float16)
    safe = lambda v: np.where(v == 0, 1, v).astype(np.float32)  # noqa: E731
    ls = np.clip(np.rint(scale / safe(d)[:, None]), 0, 63).astype(np.uint8)
    lm = np.clip(np.rint(mins / safe(dmin)[:, None]), 0, 63).astype(np.uint8)
    dsc, dm = d.astype(np.float32)[:, None] * ls, dmin.astype(np.float32)[:, None] * lm
    q = np.clip(np.rint((x + dm[..., None]) / safe(dsc)[..., None]), 0, nmax).astype(np.uint8)
    return q, ls, lm, np.stack([d, dmin], axis=1)


def _pack_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """6-bit scales and mins [nb, 8] -> llama.cpp's 12 packed bytes."""
    out = np.zeros((ls.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    out[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    return out


def _quantize_q6(x: np.ndarray) -> np.ndarray:
    xb = x.reshape(-1, 16, 16)
    at = np.take_along_axis(xb, np.abs(xb).argmax(-1)[..., None], -1)[..., 0]
    scale = at / -32.0
    d = (np.abs(scale).max(-1) / 127).astype(np.float16)
    safe = lambda v: np.where(v == 0, 1, v).astype(np.float32)  # noqa: E731
    ls = np.clip(np.rint(scale / safe(d)[:, None]), -127, 127).astype(np.int8)
    q = np.clip(np.rint(xb / safe(d.astype(np.float32)[:, None] * ls)[..., None]), -32, 31).astype(np.int16) + 32
    q = q.astype(np.uint8).reshape(-1, 2, 4, 32)  # [nb, half, quarter, l]
    ql = np.concatenate([q[:, :, 0] | (q[:, :, 2] << 4), q[:, :, 1] | (q[:, :, 3] << 4)], axis=-1).reshape(-1, 128)
    qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)
    return np.concatenate([ql, qh.reshape(-1, 64), ls.view(np.uint8), _f16_bytes(d)], axis=1)


def kquantize(w: np.ndarray, name: str) -> np.ndarray:
    """fp32 [n, k] -> the tensor's GGUF bytes, uint8 [n, k / 256 * block_bytes]."""
    n = w.shape[0]
    if name == "Q6_K":
        return _quantize_q6(w).reshape(n, -1)
    x = w.reshape(-1, 8, 32)
    q, ls, lm, dd = _quant_q45(x, 15 if name == "Q4_K" else 31)
    head = np.concatenate([_f16_bytes(dd[:, 0]), _f16_bytes(dd[:, 1]), _pack_scales(ls, lm)], axis=1)
    qs = (q[:, 0::2] & 0xF) | ((q[:, 1::2] & 0xF) << 4)  # [nb, 4, 32]: pair j's low then high nibbles
    if name == "Q4_K":
        return np.concatenate([head, qs.reshape(-1, 128)], axis=1).reshape(n, -1)
    qh = sum(((q[:, s] >> 4) & 1) << s for s in range(8)).astype(np.uint8)
    return np.concatenate([head, qh, qs.reshape(-1, 128)], axis=1).reshape(n, -1)


def random_blocks(n: int, k: int, name: str, rng: np.random.Generator) -> np.ndarray:
    """Random bytes in every field but the fp16 factors, which are small finite numbers."""
    t = kq.BY_NAME[name]
    raw = rng.integers(0, 256, size=(n * k // 256, t.block_bytes), dtype=np.uint8)
    fields = (208,) if name == "Q6_K" else (0, 2)
    for at in fields:
        raw[:, at:at + 2] = _f16_bytes(rng.standard_normal(raw.shape[0]) * 0.01)
    return raw.reshape(n, -1)


def weights(n: int, k: int, name: str, seed: int, kind: str = "quantized") -> torch.Tensor:
    rng = np.random.default_rng(seed)
    if kind == "random":
        return torch.from_numpy(random_blocks(n, k, name, rng))
    w = (rng.standard_normal((n, k)) * rng.uniform(0.2, 3.0, size=(n, k // 16)).repeat(16, axis=1)).astype(np.float32)
    return torch.from_numpy(kquantize(w, name))


def gguf_reference(raw: torch.Tensor, name: str) -> torch.Tensor:
    return torch.from_numpy(gguf_dequantize(raw.numpy(), GGMLQuantizationType[name]).astype(np.float32)).reshape(-1)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("kind", ["quantized", "random"])
def test_the_torch_dequantizer_equals_gguf_bit_for_bit(name: str, kind: str) -> None:
    raw = weights(7, 512, name, seed=1, kind=kind)
    ours, theirs = kq.BY_NAME[name].dequantize(raw), gguf_reference(raw, name)
    assert ours.shape == (7 * 512,) and torch.isfinite(theirs).all()
    assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32))


def test_the_test_quantizer_keeps_the_matrix_and_varies_the_scales() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 512)).astype(np.float32)
    for name, tol in (("Q4_K", 0.25), ("Q5_K", 0.12), ("Q6_K", 0.06)):
        back = kq.dequantize(torch.from_numpy(kquantize(w, name)), name, 8, 512).numpy()
        assert np.abs(back - w).mean() < tol * np.abs(w).mean(), name
    scales = kquantize(w, "Q4_K").reshape(-1, 144)[:, 4:16]
    assert len(np.unique(scales)) > 40  # not the all-equal scales a wrong shift would pass on


@needs_kernels
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("kind", ["quantized", "random"])
def test_the_kernels_dequantize_exactly_gguf_values(name: str, kind: str) -> None:
    """One-hot activation rows pick W's columns out exactly: m = 4 (fused path), m = k (buffered path)."""
    n, k = 9, 512
    raw = weights(n, k, name, seed=2, kind=kind)
    wt = gguf_reference(raw, name).reshape(n, k).T
    eye = torch.eye(k)
    assert torch.equal(kq.matmul(eye, raw, name, n, k), wt)
    picked = torch.cat([kq.matmul(eye[j:j + 4], raw, name, n, k) for j in range(0, k, 4)])
    assert torch.equal(picked, wt)


@needs_kernels
@pytest.mark.parametrize("name", TYPES)
def test_every_lane_of_every_panel_holds_gguf_values_at_8_to_32_rows(name: str) -> None:
    """From 5 rows of x the kernel decodes 16-row panels (csrc/gemm_kquant_panel.c: 8 weight rows in a vector's
    lanes, the next panel's blocks asked for by the first tile): one-hot rows, 8, 16 or 32 a call, pick every column
    of 37 weight rows (two full panels, then 5 rows) out exactly, random bytes included."""
    n, k = 37, 512
    eye = torch.eye(k)
    for kind in ("quantized", "random"):
        raw = weights(n, k, name, seed=3, kind=kind)
        wt = gguf_reference(raw, name).reshape(n, k).T
        for m in (8, 16, 32):
            assert torch.equal(torch.cat([kq.matmul(eye[j:j + m], raw, name, n, k) for j in range(0, k, m)]), wt), m


SHAPES = [(1, 37, 256), (3, 13, 512), (17, 5, 2048), (64, 33, 1024), (1, 1, 2048), (4, 65, 768), (5, 8, 256)]


@needs_kernels
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_the_kernels_agree_with_the_reference_matmul(name: str, m: int, n: int, k: int) -> None:
    raw = weights(n, k, name, seed=m * 1000 + n)
    x = torch.from_numpy(np.random.default_rng(k).standard_normal((m, k)).astype(np.float32))
    ref = kq.matmul_ref(x, raw, name, n, k)
    y = getattr(kq, f"matmul_{name.lower()}")(x, raw, n, k)
    bound = 1e-6 * (x.abs() @ kq.dequantize(raw, name, n, k).abs().T)
    assert y.shape == (m, n)
    assert ((y - ref).abs() <= bound).all(), float(((y - ref).abs() / bound).max())


Q8_SHAPES = [(1, 37, 256), (1, 13, 2048), (2, 5, 512), (4, 33, 1024), (3, 1, 768), (53, 3, 4096)]  # 53: 3 chunks


@needs_kernels
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("kind", ["quantized", "random"])
@pytest.mark.parametrize("m,n,k", Q8_SHAPES)
def test_the_int8_row_kernels_agree_with_their_reference(name: str, kind: str, m: int, n: int, k: int) -> None:
    """Against the quantized rows times gguf's W: fp32 order only (the block sums are exact integers)."""
    raw = weights(n, k, name, seed=m * 100 + n, kind=kind)
    x = torch.from_numpy(np.random.default_rng(k + m).standard_normal((m, k)).astype(np.float32))
    y = kq.matmul(x, raw, name, n, k, int8_rows=True)
    ref = kq.matmul_q8_ref(x, raw, name, n, k)
    bound = 1e-6 * (kq.quantize_q8k(x).abs() @ kq.dequantize(raw, name, n, k).abs().T)
    assert ((y - ref).abs() <= bound).all(), float(((y - ref).abs() / bound).max())


@needs_kernels
@pytest.mark.parametrize("name", TYPES)
def test_the_int8_rows_cost_at_most_half_a_step_per_element(name: str) -> None:
    """Against fp32 activations: each x element is off by at most its block's d / 2, so
    |y - ref| <= sum over blocks of d_b / 2 * sum |w| over the block (+ fp32 slack); and well inside it."""
    m, n, k = 3, 21, 1024
    raw = weights(n, k, name, seed=5)
    x = torch.from_numpy(np.random.default_rng(6).standard_normal((m, k)).astype(np.float32))
    w = kq.dequantize(raw, name, n, k)
    half_step = (x.abs().reshape(m, -1, 256).amax(-1) / 127 / 2).repeat_interleave(256, dim=1)
    bound = half_step @ w.abs().T + 1e-6 * (x.abs() @ w.abs().T)
    err = (kq.matmul(x, raw, name, n, k, int8_rows=True) - kq.matmul_ref(x, raw, name, n, k)).abs()
    assert (err <= bound).all()
    assert float(err.mean() / (x.abs() @ w.abs().T).mean()) < 2e-3  # relative error near llama.cpp's


@needs_kernels
@pytest.mark.parametrize("m", [1, 17])
def test_the_threads_split_rows_only_so_results_do_not_depend_on_their_number(m: int) -> None:
    raw = weights(31, 1024, "Q5_K", seed=3)
    x = torch.randn(m, 1024, generator=torch.Generator().manual_seed(0))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = [kq.matmul(x, raw, "Q5_K", 31, 1024, int8_rows=q8) for q8 in (False, True)]
        torch.set_num_threads(2)
        two = [kq.matmul(x, raw, "Q5_K", 31, 1024, int8_rows=q8) for q8 in (False, True)]
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(one, two))


@needs_kernels
@pytest.mark.parametrize("name", TYPES)
def test_an_int8_gemm_row_is_the_same_bits_in_any_slice(name: str) -> None:
    """A prefill's GEMM over chunks of x rows (24 rows at k 4096): each row's result is its own."""
    raw = weights(6, 4096, name, seed=8)
    x = torch.randn(53, 4096, generator=torch.Generator().manual_seed(1))
    full = kq.matmul(x, raw, name, 6, 4096, int8_rows=True)
    for a, b in ((0, 1), (23, 25), (30, 53)):
        assert torch.equal(kq.matmul(x[a:b], raw, name, 6, 4096, int8_rows=True), full[a:b]), (a, b)


def test_bad_shapes_are_refused_before_the_kernel_reads_anything() -> None:
    raw = weights(2, 256, "Q4_K", seed=4)
    with pytest.raises(ValueError, match="multiple of 256"):
        kq.matmul(torch.zeros(1, 300), raw, "Q4_K", 2, 300)
    with pytest.raises(ValueError, match="bytes"):
        kq.matmul(torch.zeros(1, 512), raw, "Q4_K", 2, 512, int8_rows=True)
    assert [t.name for t in kq.KQUANT_TYPES.values()] == list(TYPES)
    assert {t: kq.KQUANT_TYPES[GGMLQuantizationType[t].value].name for t in TYPES} == {t: t for t in TYPES}


@needs_kernels
@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K"])
def test_the_8_row_batch_kernel_gives_each_row_the_bits_of_the_row_passes_at_1_to_33_rows(name: str) -> None:
    """From 4 rows of x the K-quants run csrc/gemm_kquant_q8_lanes.c (8 weight rows in lanes), below it
    gemm_kquant_q8.c's row passes: every row count 1..33 (19 weight rows: a short last group) gives each row the bits
    it has alone, within the reference's bound, at 1 and 2 threads."""
    n, k = 19, 512
    raw = weights(n, k, name, seed=19)
    x = torch.randn(33, k, generator=torch.Generator().manual_seed(2))
    alone = torch.cat([kq.matmul(x[i:i + 1], raw, name, n, k, int8_rows=True) for i in range(33)])
    bound = 1e-6 * (kq.quantize_q8k(x).abs() @ kq.dequantize(raw, name, n, k).abs().T)
    assert ((alone - kq.matmul_q8_ref(x, raw, name, n, k)).abs() <= bound).all()
    before = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            for m in range(1, 34):
                got = kq.matmul(x[33 - m:], raw, name, n, k, int8_rows=True)
                assert torch.equal(got, alone[33 - m:]), (t, m)
    finally:
        torch.set_num_threads(before)


@needs_kernels
@pytest.mark.parametrize("name", TYPES)
def test_a_k_quant_linear_inside_a_team_gives_the_kernel_s_bits(name: str) -> None:
    """A decode step's GgufLinear runs the fp32-activation kernel inside gguf_linear.c's team (each thread its share
    of the output rows, as the fused decoder's head does): every output, at 1 to 3 threads, is the bits of the
    kernel's own team call on the same rows."""
    from npu_ops.gguf_modules import STEP_DECODE, GgufLinear, gguf_step
    from npu_ops.quant_gguf import GgufWeight

    n, k = 37, 512
    raw = weights(n, k, name, seed=11)
    layer = GgufLinear([GgufWeight(raw.reshape(n, -1), name, (n, k))])
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(2))
    want, lone = kq.matmul(x, raw, name, n, k), kq.matmul(x[1:2], raw, name, n, k)
    before = torch.get_num_threads()
    try:
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            with gguf_step(STEP_DECODE):
                assert torch.equal(layer(x), want) and torch.equal(layer(x[1:2]), lone), t
    finally:
        torch.set_num_threads(before)


@needs_kernels
@pytest.mark.parametrize("name", TYPES)
def test_few_rows_of_a_very_wide_int8_gemm_are_each_their_own(name: str) -> None:
    """At k = 49152 the row passes' x chunk (96 KiB of int8 rows) is one row, so 3 rows (under the 8-lane batch
    kernel's 4) take 3 chunks: each row's result is its own."""
    n, k = 4, 49152
    raw = weights(n, k, name, seed=9)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(5))
    full = kq.matmul(x, raw, name, n, k, int8_rows=True)
    for i in range(3):
        assert torch.equal(kq.matmul(x[i:i + 1], raw, name, n, k, int8_rows=True), full[i:i + 1]), i

"""The W8A8 matmul as a Triton kernel, where torch has none that fits (``torch._int_mm`` refuses M <= 16, i.e.
every decode step, and K or N not multiples of 8): ``y = (xq . Wq^T) * x_scale[m] * w_scale[n] + bias``, int8
products summed exactly in int32 (``tl.dot``), scaled in fp32 in the reference's order. Activations are
quantized per row by ``quant.quantize_rows``. Reference: ``quant.w8a8_ref`` (equal up to the final cast)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 64


@triton.jit
def _w8a8_kernel(x_ptr, w_ptr, xs_ptr, ws_ptr, b_ptr, y_ptr, m, n, k, HAS_BIAS: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], tl.int32)
    for k0 in range(0, k, BK):
        kk = k0 + rk
        a = tl.load(x_ptr + rm[:, None].to(tl.int64) * k + kk[None, :], mask=(rm[:, None] < m) & (kk[None, :] < k),
                    other=0)
        b = tl.load(w_ptr + rn[None, :].to(tl.int64) * k + kk[:, None], mask=(rn[None, :] < n) & (kk[:, None] < k),
                    other=0)
        acc += tl.dot(a, b, out_dtype=tl.int32)
    xs = tl.load(xs_ptr + rm, mask=rm < m, other=0.0)
    ws = tl.load(ws_ptr + rn, mask=rn < n, other=0.0)
    y = acc.to(tl.float32) * xs[:, None] * ws[None, :]
    if HAS_BIAS:
        y = y + tl.load(b_ptr + rn, mask=rn < n, other=0.0)[None, :]
    tl.store(y_ptr + rm[:, None].to(tl.int64) * n + rn[None, :], y.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < m) & (rn[None, :] < n))


def w8a8_matmul(xq: torch.Tensor, x_scale: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor,
                bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """xq int8 [M, K], x_scale fp32 [M], wq int8 [N, K], w_scale fp32 [N], bias fp32 [N] -> [M, N] out_dtype."""
    m, k = xq.shape
    n = wq.shape[0]
    y = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m and n:
        grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
        b = bias.float().contiguous() if bias is not None else w_scale  # not read without a bias
        _w8a8_kernel[grid](xq.contiguous(), wq.contiguous(), x_scale.float().contiguous(),
                           w_scale.float().contiguous(), b, y, m, n, k,
                           HAS_BIAS=bias is not None, BM=BLOCK_M, BN=BLOCK_N, BK=BLOCK_K)
    return y

"""RMSNorm, fused with the residual add before it, as a Triton kernel: ``r = x + residual`` (rounded to the
model dtype, as the eager add is), ``out = weight * rms_norm(r)`` in Hugging Face's order (normalise in
fp32, cast, then scale). One program a row. References: ``ops.add_rms_norm_ref`` and ``ops.rms_norm_ref``."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from npu_ops.triton_support import next_pow2


@triton.jit
def _rms_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, stride_x, stride_r, n, eps,
                HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    mask = c < n
    x = tl.load(x_ptr + row * stride_x + c, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        x = x + tl.load(res_ptr + row * stride_r + c, mask=mask, other=0.0).to(tl.float32)
        x = x.to(res_out_ptr.dtype.element_ty)  # the sum as the eager add leaves it
        tl.store(res_out_ptr + row * n + c, x, mask=mask)
        x = x.to(tl.float32)
    var = tl.sum(x * x, axis=0) / n
    h = (x * tl.math.rsqrt(var + eps)).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n + c, (w * h).to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual [T, hidden] -> (rms_norm(x + residual), x + residual); without a residual, (rms_norm(x), x)."""
    t, n = x.shape
    x = x if x.stride(-1) == 1 else x.contiguous()
    out = torch.empty((t, n), dtype=x.dtype, device=x.device)
    if residual is None:
        res, res_out = x, x
    else:
        res = residual if residual.stride(-1) == 1 else residual.contiguous()
        res_out = torch.empty((t, n), dtype=x.dtype, device=x.device)
    if t:
        _rms_kernel[(t,)](x, res, weight.contiguous(), out, res_out, x.stride(0), res.stride(0), n, float(eps),
                          HAS_RES=residual is not None, BLOCK=next_pow2(n))
    return out, res_out

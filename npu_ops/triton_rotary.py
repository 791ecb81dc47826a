"""Rotary embedding (Hugging Face's rotate-half layout) as a Triton kernel over [T, heads, D] rows with any
token and head strides (the model turns q's and k's heads inside the packed qkv rows): ``x * cos +
rotate_half(x) * sin``, computed in fp32 and rounded once. Reference: ``ops.rotary_ref``."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from npu_ops.triton_support import next_pow2


@triton.jit
def _rotary_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, stride_xt, stride_xh, stride_ct, stride_st, heads,
                   HALF: tl.constexpr, HP: tl.constexpr, DP: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, HP)
    d = tl.arange(0, DP)
    mask = (h[:, None] < heads) & (d[None, :] < HALF)
    base = x_ptr + t * stride_xt + h[:, None] * stride_xh + d[None, :]
    x1 = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF, mask=mask, other=0.0).to(tl.float32)
    dm = d < HALF
    c1 = tl.load(cos_ptr + t * stride_ct + d, mask=dm, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + t * stride_ct + HALF + d, mask=dm, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(sin_ptr + t * stride_st + d, mask=dm, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(sin_ptr + t * stride_st + HALF + d, mask=dm, other=0.0).to(tl.float32)[None, :]
    o = out_ptr + t * heads * 2 * HALF + h[:, None] * 2 * HALF + d[None, :]
    tl.store(o, (x1 * c1 - x2 * s1).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(o + HALF, (x2 * c2 + x1 * s2).to(out_ptr.dtype.element_ty), mask=mask)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D] (unit last stride), cos / sin [T, D] -> a new contiguous [T, heads, D]."""
    t, heads, d = x.shape
    if d % 2:
        raise ValueError(f"rotary needs an even head size, got {d}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty((t, heads, d), dtype=x.dtype, device=x.device)
    cos, sin = (c if c.stride(-1) == 1 else c.contiguous() for c in (cos, sin))
    if t:
        _rotary_kernel[(t,)](x, cos, sin, out, x.stride(0), x.stride(1), cos.stride(0), sin.stride(0), heads,
                             HALF=d // 2, HP=next_pow2(heads), DP=next_pow2(d // 2))
    return out

"""The KV-cache write (reshape-and-cache) as a Triton kernel: each token's K and V rows [kv_heads, D] go to
its slot of the pages; into an int8 cache each (token, head) row is quantized first exactly as
``quant_kv.quantize`` does (scale = amax / 127, 1 for a zero row; round half to even; the fp32 scale's bytes
after the values). Reference: ``ops.write_kv_ref``. A negative slot is skipped: a CUDA graph's padded rows
write nowhere."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from npu_ops import quant_kv
from npu_ops.triton_support import next_pow2


@triton.jit
def _round_half_even(y):
    f = tl.floor(y)
    diff = y - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
    return tl.where(diff > 0.5, f + 1.0, tl.where(diff < 0.5, f, tl.where(odd, f + 1.0, f)))


@triton.jit
def _quantize_store(x, dst, rows, d, mask, hmask, HEAD_DIM: tl.constexpr, ROW: tl.constexpr):
    """[heads, D] fp32 rows -> int8 values and their fp32 scale after them (quant_kv's row)."""
    amax = tl.max(tl.where(mask, tl.abs(x), 0.0), axis=1)
    s = tl.where(amax > 0, tl.math.div_rn(amax, 127.0), 1.0)
    qv = tl.clamp(_round_half_even(tl.math.div_rn(x, s[:, None])), -127.0, 127.0)
    tl.store(dst + rows[:, None] * ROW + d[None, :], qv.to(tl.int8), mask=mask)
    tl.store((dst + rows * ROW + HEAD_DIM).to(tl.pointer_type(tl.float32)), s, mask=hmask)


@triton.jit
def _write_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, stride_kt, stride_kh, stride_vt, stride_vh, kv_heads,
                  HEAD_DIM: tl.constexpr, ROW: tl.constexpr, QUANT: tl.constexpr, HP: tl.constexpr,
                  DP: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    h = tl.arange(0, HP)
    d = tl.arange(0, DP)
    live = (tl.zeros([HP], tl.int64) + slot) >= 0  # a tensor: the interpreter takes no scalar in a mask
    mask = (h[:, None] < kv_heads) & (d[None, :] < HEAD_DIM) & live[:, None]
    k = tl.load(k_ptr + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask, other=0.0)
    v = tl.load(v_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask, other=0.0)
    rows = slot * kv_heads + h  # each head's row of the pages
    if QUANT:
        hmask = (h < kv_heads) & live
        _quantize_store(k.to(tl.float32), kc_ptr, rows, d, mask, hmask, HEAD_DIM, ROW)
        _quantize_store(v.to(tl.float32), vc_ptr, rows, d, mask, hmask, HEAD_DIM, ROW)
    else:
        tl.store(kc_ptr + rows[:, None] * ROW + d[None, :], k.to(kc_ptr.dtype.element_ty), mask=mask)
        tl.store(vc_ptr + rows[:, None] * ROW + d[None, :], v.to(vc_ptr.dtype.element_ty), mask=mask)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor) -> None:
    """k, v: [T, kv_heads, D] (any strides with unit last stride) written at ``slots`` [T] of the pages."""
    t, kvh, hd = k.shape
    row = k_cache.shape[-1]
    quant = quant_kv.is_quantized(k_cache)
    if (quant and row != quant_kv.row_bytes(hd)) or (not quant and row != hd) or k_cache.shape[2] != kvh:
        raise ValueError(f"K/V rows [{kvh}, {hd}] do not fit pages of shape {tuple(k_cache.shape)}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the Triton KV write takes contiguous pages")
    if t == 0:
        return
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    _write_kernel[(t,)](k, v, k_cache, v_cache, slots.contiguous(), k.stride(0), k.stride(1), v.stride(0),
                        v.stride(1), kvh, HEAD_DIM=hd, ROW=row, QUANT=quant, HP=next_pow2(kvh), DP=next_pow2(hd))

"""int8 KV cache: the row format, its PyTorch reference and the CPU kernel's binding.

A block fills one token at a time, so scales are per token and per KV head: each cache row (one
token, one head) is ``head_dim`` int8 values followed by their fp32 scale (4 bytes), symmetric
(``x ~= q * scale``, scale = amax / 127). Keeping the scale inside the row keeps the pool one tensor
of the usual layout ``[num_blocks, block_size, kv_heads, head_dim + 4]`` (dtype int8), so the model
code and the block tables do not change: ``k_cache.dtype == torch.int8`` is what marks the format.
The CPU attention kernel (csrc/attention_int8.c) reads such pages in place; the reference
dequantizes what it gathers."""
from __future__ import annotations

import ctypes
from functools import lru_cache

import torch

from npu_ops import cpu_kernels

SCALE_BYTES = 4
QMAX = 127


def row_bytes(head_dim: int) -> int:
    """Bytes of one cache row (one token, one KV head)."""
    return head_dim + SCALE_BYTES


def is_quantized(cache: torch.Tensor) -> bool:
    return cache.dtype == torch.int8


def head_dim(cache: torch.Tensor) -> int:
    return cache.shape[-1] - SCALE_BYTES if is_quantized(cache) else cache.shape[-1]


def quantize(x: torch.Tensor) -> torch.Tensor:
    """[..., D] float -> [..., D + 4] int8 rows (values, then the fp32 scale's bytes)."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))
    q = torch.round(xf / scale).clamp_(-QMAX, QMAX).to(torch.int8)
    return torch.cat([q, scale.contiguous().view(torch.int8)], dim=-1)


def dequantize(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[..., D + 4] int8 rows -> [..., D] in ``dtype``."""
    d = rows.shape[-1] - SCALE_BYTES
    scale = rows[..., d:].contiguous().view(torch.float32)
    return (rows[..., :d].float() * scale).to(dtype)


@lru_cache(maxsize=4)
def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """The int8 attention kernel's types, as csrc/kernels.h declares them."""
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn = lib.paged_attention_rows_i8
    fn.argtypes = [p, p, p, p, p, p, p, i64, i64, i64, i64, i64, i64, i64, ctypes.c_float, ctypes.c_int]
    fn.restype = ctypes.c_int
    return lib


def kernel_supports(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    return (q.device.type == "cpu" and q.dtype == torch.float32 and is_quantized(k_cache) and is_quantized(v_cache)
            and k_cache.is_contiguous() and v_cache.is_contiguous() and cpu_kernels.load() is not None)


def paged_attention_rows(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                         row_seq: torch.Tensor, row_pos: torch.Tensor, scale: float) -> torch.Tensor:
    """cpu_kernels.paged_attention_rows over int8 pages (see there for the row contract)."""
    lib = _declare(cpu_kernels.load())
    return cpu_kernels.call_attention_rows(lib.paged_attention_rows_i8, "paged_attention_rows_i8", q, k_cache,
                                           v_cache, block_tables, row_seq, row_pos, scale)

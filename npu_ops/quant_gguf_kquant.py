"""GGUF K-quant weights (Q4_K, Q5_K, Q6_K: the types of Q4_K_M and Q5_K_M files) kept as the file stores them.

Each type has a PyTorch reference dequantizer (vectorised; equal, bit for bit, to ``gguf.quants.dequantize``:
the same fp32 products and differences, each rounded once), a reference matmul (dequantize, then an fp32
matmul) and the C kernel (csrc/gemm_kquant.c, AVX2 + FMA) that dequantizes in registers and keeps fp32
activations, so it differs from the reference only in the order of its fp32 sums. The ``_q8`` kernels
(csrc/gemm_kquant_q8.c) take int8 activations instead (llama.cpp's Q8_K rows), for the bandwidth-bound decode step:
``matmul(..., int8_rows=True)`` against ``matmul_q8_ref``.

A row of W ([n_out, k], k a multiple of 256) is k / 256 consecutive super-blocks; ``raw`` is the tensor's bytes as
uint8, [n_out, k / 256 * block_bytes] or flat. ``KQUANT_TYPES`` is the table a loader plugs in: GGML type id ->
``KQuantType`` (block bytes, block size, dequantizer, C kernel name)."""
from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import torch

from npu_ops import cpu_kernels, quant_gguf

logger = logging.getLogger(__name__)

QK_K = 256
_I64, _P = ctypes.c_int64, ctypes.c_void_p


def _half(raw: torch.Tensor, start: int) -> torch.Tensor:
    """[n, bytes] uint8 -> the fp16 field at byte `start` of each block, as fp32 [n, 1]."""
    return raw[:, start:start + 2].contiguous().view(torch.float16).to(torch.float32)


def _scale_min_k4(sc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 12 packed bytes of a Q4_K / Q5_K super-block -> 6-bit scales and mins [n, 8] (llama.cpp's
    get_scale_min_k4): sub-blocks 0-3 in the low 6 bits of bytes 0-3 / 4-7, sub-blocks 4-7 in the nibbles of
    bytes 8-11 with their top 2 bits in the top bits of bytes 0-3 / 4-7."""
    d, m, md = sc[:, 0:4], sc[:, 4:8], sc[:, 8:12]
    scale = torch.cat([d & 63, (md & 0xF) | ((d >> 2) & 0x30)], dim=1)
    mins = torch.cat([m & 63, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return scale.to(torch.float32), mins.to(torch.float32)


def _blocks(raw: torch.Tensor, block_bytes: int) -> torch.Tensor:
    flat = raw.reshape(-1)
    if flat.dtype != torch.uint8 or flat.numel() % block_bytes:
        raise ValueError(f"expected uint8 bytes, a multiple of {block_bytes}; got {flat.dtype} x {flat.numel()}")
    return flat.reshape(-1, block_bytes)


def _nibbles(qs: torch.Tensor, groups: int) -> torch.Tensor:
    """[n, groups * 32] bytes -> [n, groups * 2, 32]: each group's 32 low nibbles, then its 32 high ones."""
    q = qs.reshape(qs.shape[0], groups, 1, 32) >> torch.tensor([0, 4], dtype=torch.uint8).reshape(1, 1, 2, 1)
    return (q & 0xF).reshape(qs.shape[0], groups * 2, 32)


def dequantize_q4_k(raw: torch.Tensor) -> torch.Tensor:
    """Q4_K (144 bytes: d, dmin fp16; 12 bytes of scales and mins; 128 of nibbles) -> fp32 [blocks * 256]."""
    b = _blocks(raw, 144)
    scale, mins = _scale_min_k4(b[:, 4:16])
    d = (_half(b, 0) * scale).unsqueeze(-1)
    dm = (_half(b, 2) * mins).unsqueeze(-1)
    q = _nibbles(b[:, 16:], 4).to(torch.float32)
    return (d * q - dm).reshape(-1)


def dequantize_q5_k(raw: torch.Tensor) -> torch.Tensor:
    """Q5_K (176 bytes: d, dmin; 12 of scales and mins; qh[32], bit s of qh[l] the fifth bit of element l of
    sub-block s; 128 of nibbles) -> fp32 [blocks * 256]."""
    b = _blocks(raw, 176)
    scale, mins = _scale_min_k4(b[:, 4:16])
    d = (_half(b, 0) * scale).unsqueeze(-1)
    dm = (_half(b, 2) * mins).unsqueeze(-1)
    shifts = torch.arange(8, dtype=torch.uint8).reshape(1, 8, 1)
    qh = (b[:, 16:48].reshape(-1, 1, 32) >> shifts) & 1
    q = (_nibbles(b[:, 48:], 4) | (qh << 4)).to(torch.float32)
    return (d * q - dm).reshape(-1)


def dequantize_q6_k(raw: torch.Tensor) -> torch.Tensor:
    """Q6_K (210 bytes: ql[128] low nibbles, qh[64] 2 high bits, 16 int8 scales, d fp16; w = d * scale * (q - 32)
    by sub-blocks of 16) -> fp32 [blocks * 256]."""
    b = _blocks(raw, 210)
    n = b.shape[0]
    scales = b[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
    d = (_half(b, 208) * scales).reshape(n, 16, 1)
    ql = b[:, :128].reshape(n, 2, 1, 64) >> torch.tensor([0, 4], dtype=torch.uint8).reshape(1, 1, 2, 1)
    ql = (ql & 0xF).reshape(n, 8, 32)
    qh = b[:, 128:192].reshape(n, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 4, 1)
    qh = (qh & 3).reshape(n, 8, 32)
    q = ((ql | (qh << 4)).to(torch.int8) - 32).reshape(n, 16, 16).to(torch.float32)
    return (d * q).reshape(-1)


@dataclass(frozen=True)
class KQuantType:
    """One K-quant block type: what a loader needs to keep it packed or to dequantize it."""
    name: str
    ggml_type: int  # gguf.GGMLQuantizationType's value
    block_bytes: int
    block_size: int  # weights a block holds
    dequantize: Callable[[torch.Tensor], torch.Tensor]  # raw uint8 bytes -> fp32, flat
    kernel: str  # the C entry point (csrc/kernels.h): fp32 activations
    kernel_q8: str  # the same against int8 activations (Q8_K rows)
    row_kernel: str  # one row dequantized (gguf_dequant_<type>: an embedding row in the fused decode step)


KQUANT_TYPES: dict[int, KQuantType] = {t.ggml_type: t for t in (
    KQuantType("Q4_K", 12, 144, QK_K, dequantize_q4_k, "gguf_matmul_q4_k", "gguf_matmul_q4_k_q8",
               "gguf_dequant_q4_k"),
    KQuantType("Q5_K", 13, 176, QK_K, dequantize_q5_k, "gguf_matmul_q5_k", "gguf_matmul_q5_k_q8",
               "gguf_dequant_q5_k"),
    KQuantType("Q6_K", 14, 210, QK_K, dequantize_q6_k, "gguf_matmul_q6_k", "gguf_matmul_q6_k_q8",
               "gguf_dequant_q6_k"),
)}
BY_NAME: dict[str, KQuantType] = {t.name: t for t in KQUANT_TYPES.values()}


def dequantize(raw: torch.Tensor, name: str, n_out: int, k: int) -> torch.Tensor:
    """W's bytes -> fp32 [n_out, k] by the reference dequantizer of type `name` (Q4_K, Q5_K, Q6_K)."""
    return BY_NAME[name].dequantize(raw).reshape(n_out, k)


def matmul_ref(x: torch.Tensor, raw: torch.Tensor, name: str, n_out: int, k: int) -> torch.Tensor:
    """The reference: dequantize W, then x [m, k] fp32 @ W^T -> [m, n_out]."""
    return x.to(torch.float32) @ dequantize(raw, name, n_out, k).T


@lru_cache(maxsize=4)
def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """The K-quant linears' types, as csrc/kernels.h declares them."""
    for t in KQUANT_TYPES.values():
        for name in (t.kernel, t.kernel_q8):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = [_P, _I64, _I64, _P, _I64, _P], None
        row = getattr(lib, t.row_kernel)
        row.argtypes, row.restype = [_P, _I64, _P], None
    return lib


def _lib() -> ctypes.CDLL:
    return cpu_kernels.loaded(_declare)


def quantize_q8k(x: torch.Tensor) -> torch.Tensor:
    """The int8 activations of the ``_q8`` kernels, dequantized: each row's 256-column blocks as llama.cpp's Q8_K
    (d = max|x| / 127, q = round-half-even(x * (1 / d)) in [-127, 127]) -> q * d, fp32 [m, k]."""
    xb = x.to(torch.float32).reshape(x.shape[0], -1, QK_K)
    d = xb.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(d != 0, 1.0 / torch.where(d != 0, d, torch.ones_like(d)), torch.zeros_like(d))
    q = torch.round(xb * inv).clamp_(-127, 127)
    return (q * d).reshape(x.shape)


def matmul_q8_ref(x: torch.Tensor, raw: torch.Tensor, name: str, n_out: int, k: int) -> torch.Tensor:
    """The ``_q8`` kernels' reference: the quantized rows (``quantize_q8k``) times the dequantized W."""
    return matmul_ref(quantize_q8k(x), raw, name, n_out, k)


def matmul(x: torch.Tensor, raw: torch.Tensor, name: str, n_out: int, k: int, int8_rows: bool = False) -> torch.Tensor:
    """x [m, k] fp32 @ W^T -> [m, n_out] by the C kernel of type `name`, W's bytes read in place (contiguous
    uint8, n_out * k / 256 blocks); ``int8_rows``: the kernel against Q8_K activations (``matmul_q8_ref``).
    Threads: torch.get_num_threads()'s OpenMP team."""
    t = BY_NAME[name]
    if k % t.block_size or x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"{name} matmul: x {tuple(x.shape)} against W [{n_out}, {k}] (k must be a multiple of "
                         f"{t.block_size})")
    w = raw.contiguous()
    if w.dtype != torch.uint8 or w.numel() != n_out * (k // t.block_size) * t.block_bytes:
        raise ValueError(f"{name} matmul: {w.numel()} bytes of {w.dtype} for W [{n_out}, {k}]")
    x = x.to(torch.float32).contiguous()
    y = torch.empty(x.shape[0], n_out, dtype=torch.float32)
    getattr(_lib(), t.kernel_q8 if int8_rows else t.kernel)(w.data_ptr(), n_out, k, x.data_ptr(), x.shape[0],
                                                            y.data_ptr())
    return y


def matmul_q4_k(x: torch.Tensor, raw: torch.Tensor, n_out: int, k: int) -> torch.Tensor:
    return matmul(x, raw, "Q4_K", n_out, k)


def matmul_q5_k(x: torch.Tensor, raw: torch.Tensor, n_out: int, k: int) -> torch.Tensor:
    return matmul(x, raw, "Q5_K", n_out, k)


def matmul_q6_k(x: torch.Tensor, raw: torch.Tensor, n_out: int, k: int) -> torch.Tensor:
    return matmul(x, raw, "Q6_K", n_out, k)


def _register() -> None:
    """Each K-quant into quant_gguf's table (which imports this module the first time it looks a type up): GGUF
    linears and embeddings of these types load packed, on the fp32-activation kernels (exactly the dequantized
    values, fp32 sums) and, for calls of few rows where the load asks for it, the ``_q8`` ones (Q8_K rows)."""
    for t in KQUANT_TYPES.values():
        def rows(raw: torch.Tensor, deq: Callable[[torch.Tensor], torch.Tensor] = t.dequantize) -> torch.Tensor:
            return deq(raw).reshape(*raw.shape[:-1], -1)  # the table's contract keeps the leading dims
        quant_gguf.register(quant_gguf.BlockType(t.name, t.ggml_type, t.block_size, t.block_bytes, rows, t.kernel,
                                                 t.row_kernel, t.kernel_q8))


_register()

"""ctypes bindings of the int8 linears in csrc/gemm_int8.c (W8A16), csrc/gemm_w8a8.c (W8A8) and
csrc/gemm_w8i16.c (the int8 LM head), built with the other CPU kernels by npu_ops.cpu_kernels. The layouts are
the C files': W8A16 panels of 16 columns k-major, W8A8 panels of 16 (AVX512-VNNI) or 8 columns by groups of 4 k
plus the column sums, W8I16 panels of 16 columns by pairs of k. ``lib`` lets a
test run another build of the same sources (e.g. the AVX2 core on a VNNI machine)."""
from __future__ import annotations

import ctypes
from functools import lru_cache

import torch

from npu_ops import cpu_kernels

_I64, _P = ctypes.c_int64, ctypes.c_void_p


@lru_cache(maxsize=4)
def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """The int8 linears' types, as csrc/kernels.h declares them."""
    lib.packed_w8a16_numel.argtypes, lib.packed_w8a16_numel.restype = [_I64, _I64], _I64
    lib.packed_w8a8_numel.argtypes, lib.packed_w8a8_numel.restype = [_I64, _I64], _I64
    lib.packed_w8i16_numel.argtypes, lib.packed_w8i16_numel.restype = [_I64, _I64], _I64
    lib.pack_w8a16.argtypes = lib.pack_w8a8.argtypes = lib.pack_w8i16.argtypes = [_P, _I64, _I64, _P]
    lib.linear_w8i16_f32.argtypes = [_P, _I64, _I64, _P, _P, _I64, _P, _P, ctypes.c_int]
    lib.linear_w8a16_f32.argtypes = [_P, _I64, _I64, _P, _P, _I64, _P, _P, ctypes.c_int]
    lib.quantize_rows_i8.argtypes = [_P, _I64, _I64, _P, _P, ctypes.c_int]
    lib.linear_w8a8_i8.argtypes = [_P, _P, _I64, _I64, _P, _P, _I64, _P, _P, ctypes.c_int]
    lib.gemm_i8_i32.argtypes = [_P, _I64, _I64, _P, _I64, _P]
    lib.linear_w8a8_f32.argtypes = [_P, _I64, _I64, _P, _P, _I64, _P, _P, ctypes.c_int]
    lib.w8a8_panel_width.argtypes, lib.w8a8_panel_width.restype = [], ctypes.c_int
    for name in ("linear_w8a8_f32", "linear_w8a8_i8", "gemm_i8_i32", "linear_w8i16_f32"):
        getattr(lib, name).restype = ctypes.c_int  # 0, or 3: no scratch
    for name in ("pack_w8a16", "pack_w8a8", "pack_w8i16", "linear_w8a16_f32", "quantize_rows_i8"):
        getattr(lib, name).restype = None
    return lib


def _lib() -> ctypes.CDLL:
    return cpu_kernels.loaded(_declare)


def available() -> bool:
    return cpu_kernels.load() is not None


def w8a8_core(lib: ctypes.CDLL | None = None) -> str:
    """Which integer core this build's W8A8 kernels run: ``vnni`` (AVX512-VNNI, offset activations) or
    ``maddubs`` (AVX2's sign trick, or the plain loops without AVX2)."""
    return "vnni" if _declare(lib or _lib()).w8a8_panel_width() == 16 else "maddubs"


_PACKERS = {"w8a16": ("packed_w8a16_numel", "pack_w8a16"), "w8a8": ("packed_w8a8_numel", "pack_w8a8"),
            "w8i16": ("packed_w8i16_numel", "pack_w8i16")}


def pack(wq: torch.Tensor, scheme: str, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """int8 [N, K] -> the kernel layout of ``scheme`` (w8a16 | w8a8 | w8i16) of ``lib`` (default: the loaded
    kernels)."""
    lib, w = _declare(lib) if lib is not None else _lib(), wq.detach().contiguous()
    n, k = w.shape
    numel_fn, pack_fn = _PACKERS[scheme]
    out = torch.empty(getattr(lib, numel_fn)(n, k), dtype=torch.int8)
    getattr(lib, pack_fn)(w.data_ptr(), n, k, out.data_ptr())
    return out


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [M, K] -> (int8 [M, K4 * 4] zero padded, fp32 scale [M]); see quant.quantize_rows."""
    lib, x = _lib(), x.contiguous()
    m, k = x.shape
    xq = torch.empty(m, (k + 3) // 4 * 4, dtype=torch.int8)
    xs = torch.empty(m, dtype=torch.float32)
    lib.quantize_rows_i8(x.data_ptr(), m, k, xq.data_ptr(), xs.data_ptr(), torch.get_num_threads())
    return xq, xs


def gemm_i32(xq: torch.Tensor, packed: torch.Tensor, k: int, n: int, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """Exact int32 products of int8 rows [M, K4 * 4] (from ``quantize_rows`` or padded by hand) with a
    W8A8-packed weight (packed by the same ``lib``): the integer core the tests hold to the reference."""
    lib, xq = _declare(lib) if lib is not None else _lib(), xq.contiguous()
    acc = torch.empty(xq.shape[0], n, dtype=torch.int32)
    if lib.gemm_i8_i32(xq.data_ptr(), xq.shape[0], k, packed.data_ptr(), n, acc.data_ptr()):
        raise MemoryError("gemm_i8_i32: no scratch")
    return acc


def linear(x: torch.Tensor, packed: torch.Tensor, scheme: str, w_scale: torch.Tensor, k: int, n: int,
           bias: torch.Tensor | None, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    lib, x = _declare(lib) if lib is not None else _lib(), x.contiguous()
    m = x.shape[0]
    y = x.new_empty(m, n)
    b = None if bias is None else bias.data_ptr()
    threads = torch.get_num_threads()
    if scheme == "w8a16":
        lib.linear_w8a16_f32(x.data_ptr(), m, k, packed.data_ptr(), w_scale.data_ptr(), n, b, y.data_ptr(), threads)
        return y
    if scheme == "w8i16":
        if lib.linear_w8i16_f32(x.data_ptr(), m, k, packed.data_ptr(), w_scale.data_ptr(), n, b, y.data_ptr(),
                                threads):
            raise MemoryError("linear_w8i16_f32: no scratch for the quantized rows")
        return y
    # quantize_rows_i8 + linear_w8a8_i8 in one call (csrc/gemm_int8.c)
    if lib.linear_w8a8_f32(x.data_ptr(), m, k, packed.data_ptr(), w_scale.data_ptr(), n, b, y.data_ptr(), threads):
        raise MemoryError("linear_w8a8_f32: no scratch for the quantized rows")
    return y

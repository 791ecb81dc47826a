"""ctypes bindings of the GGUF block-quantized linears (csrc/gemm_gguf.c: Q4_0, Q4_1, Q8_0 and our Q4_1F against fp32
activations, csrc/gemm_gguf_q8.c: the same against int8 ones; Q5_0 and Q5_1: csrc/gemm_gguf_q5*.c; csrc/gguf_linear.c:
a projection of one or more segments over a team, its prefill pieces through csrc/gemm_gguf_tile.c's fp32 tiles),
built with the other CPU kernels by npu_ops.cpu_kernels. Each
block type's kernels are found by the names npu_ops.quant_gguf's table gives them; a segment table hands the C side
their addresses, so a type registered there runs in the fused decoder too."""
from __future__ import annotations

import ctypes
from functools import lru_cache

import torch

from npu_ops import cpu_kernels
from npu_ops.quant_gguf import GgufWeight, block_type

_I64, _P = ctypes.c_int64, ctypes.c_void_p
# csrc/gguf_linear.h's gguf_seg: fn, row_fn, w, rows, row_bytes, fn_q8, q8_steps, tile_block, interleave
SEG_FIELDS = 9


@lru_cache(maxsize=4)
def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """The GGUF kernels' types, as csrc/kernels.h declares them."""
    for t in ("q4_0", "q4_1", "q8_0", "q4_1f", "q5_0", "q5_1", "q4_0x4", "q4_1x4", "q4_1fx4"):
        for name in (f"gguf_matmul_{t}", f"gguf_matmul_{t}_q8"):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = [_P, _I64, _I64, _P, _I64, _P], None
        if not t.endswith("x4"):  # the interleaved types' rows are their base type's
            row = getattr(lib, f"gguf_dequant_{t}")
            row.argtypes, row.restype = [_P, _I64, _P], None
    lib.gguf_linear_f32.argtypes = [_P, _I64, _P, _I64, _I64, _P, _P, _I64, ctypes.c_int, ctypes.c_int]
    lib.gguf_linear_f32.restype = ctypes.c_int
    lib.gguf_int8_vnni.argtypes, lib.gguf_int8_vnni.restype = [], ctypes.c_int
    for name in ("gguf_xq_team_rows", "gguf_tile_own_panels"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = [], ctypes.c_long
    lib.gguf_xq_share.argtypes, lib.gguf_xq_share.restype = [ctypes.c_int], None
    return lib


def _lib() -> ctypes.CDLL | None:
    lib = cpu_kernels.load()
    return None if lib is None else _declare(lib)


def _address(lib: ctypes.CDLL, name: str | None) -> int:
    if name is None or not hasattr(lib, name):
        return 0
    return int(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0)


def runnable(kind: str) -> str | None:
    """None where a weight of block type ``kind`` runs on the CPU kernels; else why not (for the load report)."""
    bt = block_type(kind)
    if bt is None or bt.kernel is None:
        return f"no CPU kernel for {kind}"
    lib = _lib()
    if lib is None:
        return "the CPU kernels are not loaded"
    if not _address(lib, bt.kernel):
        return f"the CPU kernels lack {bt.kernel}"
    return None


def embeddable(kind: str) -> bool:
    """Whether the C decode step can dequantize an embedding row of ``kind`` (its row kernel is built)."""
    bt, lib = block_type(kind), _lib()
    return bt is not None and bt.interleave == 1 and lib is not None and _address(lib, bt.row_kernel) != 0


def segments(parts: list[GgufWeight], int8_steps: int = 0, tiles: bool = True) -> torch.Tensor:
    """int64 [len(parts) + 1, SEG_FIELDS]: csrc/gguf_linear.h's gguf_seg of each part (its kernels' addresses, its bytes;
    calls of the step kinds whose bit ``int8_steps`` sets take the type's int8-activation kernel where it has one;
    prefill pieces on fp32 activations take csrc/gemm_gguf_tile.c's tiles over its row kernel with ``tiles``, where
    it has one),
    then a row of zeros that ends the table (gguf_seg_count)."""
    lib = _lib()
    assert lib is not None
    rows = []
    for p in parts:
        bt = p.block_type
        q8 = _address(lib, bt.kernel_q8) if int8_steps else 0
        row = _address(lib, bt.row_kernel)
        rows.append([_address(lib, bt.kernel), row, p.data.data_ptr(), p.shape[0], p.data.shape[1], q8,
                     int8_steps if q8 else 0, bt.block_size if row and tiles else 0, bt.interleave])
    return torch.tensor(rows + [[0] * SEG_FIELDS], dtype=torch.int64)


def has_int8_kernel(kind: str) -> bool:
    """Whether block type ``kind`` has a built int8-activation kernel (``BlockType.kernel_q8``)."""
    bt, lib = block_type(kind), _lib()
    return bt is not None and lib is not None and _address(lib, bt.kernel_q8) != 0


def linear(x: torch.Tensor, segs: torch.Tensor, k: int, n: int, bias: torch.Tensor | None, step: int) -> torch.Tensor:
    """x [M, k] fp32 . W^T (+ bias) over a segment table (``segments``) -> [M, n], a call of step kind ``step``
    (gguf_modules.STEP_*: which segments take their int8 kernels)."""
    lib, x = _lib(), x.contiguous()
    assert lib is not None
    y = x.new_empty(x.shape[0], n)
    rc = lib.gguf_linear_f32(segs.data_ptr(), segs.shape[0] - 1, x.data_ptr(), x.shape[0], k,
                             None if bias is None else bias.data_ptr(), y.data_ptr(), n, torch.get_num_threads(), step)
    if rc:
        raise MemoryError("gguf_linear_f32: no scratch")
    return y


def team_counts() -> tuple[int, int]:
    """Counts over every call so far (the tests' hooks in csrc/gguf_linear.c, gemm_gguf_tile.c): rows of x a team
    quantized once for all its threads, and tile calls that malloc'd their own panels (no caller's work)."""
    lib = _lib()
    assert lib is not None
    return int(lib.gguf_xq_team_rows()), int(lib.gguf_tile_own_panels())


def share_quantized_x(on: bool) -> None:
    """Whether a GGUF projection's team quantizes x once for all its threads (csrc/gguf_linear.c; on by default):
    off only for an A/B of the two in one run (tools/bench_gguf_kernels.py --team)."""
    lib = _lib()
    assert lib is not None
    lib.gguf_xq_share(1 if on else 0)


def _lib_or(lib: ctypes.CDLL | None) -> ctypes.CDLL | None:
    """``lib`` (another build of the kernels, a test's) declared, else the loaded one."""
    return _declare(lib) if lib is not None else _lib()


def int8_core(lib: ctypes.CDLL | None = None) -> str:
    """How this build's int8-activation kernels sum bytes (csrc/dot_u8s8.h): ``vnni`` or ``maddubs``."""
    lib = _lib_or(lib)
    assert lib is not None
    return "vnni" if lib.gguf_int8_vnni() else "maddubs"


def matmul(x: torch.Tensor, w: GgufWeight, int8_rows: bool = False, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """x [M, k] fp32 . W^T by the type's own kernel, called directly (the table's contract, as the tests hold it);
    ``int8_rows``: its int8-activation kernel (``quant_gguf.matmul_q8_ref``); ``lib``: another build of the kernels
    (a test's), else the loaded one."""
    lib, x = _lib_or(lib), x.contiguous().float()
    assert lib is not None
    bt = w.block_type
    if x.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"{bt.name} matmul: x {tuple(x.shape)} against W {w.shape}")
    address = _address(lib, bt.kernel_q8 if int8_rows else bt.kernel)
    if not address:
        raise ValueError(f"{bt.name} has no {'int8' if int8_rows else 'fp32'}-activation kernel built")
    fn = ctypes.CFUNCTYPE(None, _P, _I64, _I64, _P, _I64, _P)(address)
    y = x.new_empty(x.shape[0], w.shape[0])
    fn(w.data.data_ptr(), w.shape[0], w.shape[1], x.data_ptr(), x.shape[0], y.data_ptr())
    return y


def dequantize_row(w: GgufWeight, row: int) -> torch.Tensor:
    """Row ``row`` of W dequantized by the type's row kernel (what the C decode step's embedding reads)."""
    lib = _lib()
    assert lib is not None
    if w.block_type.interleave > 1:
        raise ValueError(f"{w.kind}: rows interleaved in groups have no row of their own to dequantize")
    fn = ctypes.CFUNCTYPE(None, _P, _I64, _P)(_address(lib, w.block_type.row_kernel))
    out = torch.empty(w.shape[1])
    fn(w.data[row].data_ptr(), w.shape[1], out.data_ptr())
    return out

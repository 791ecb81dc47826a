"""GGUF's 4-bit simple blocks repacked once at load with 4 weight rows interleaved (csrc/gguf_x4.h says the layout
and why): the block types Q4_0x4, Q4_1x4 and Q4_1Fx4, registered in npu_ops.quant_gguf's table as a plug-in. Their
kernels give the bits of the type's own on the rows as GGUF stores them; their dequantizer un-interleaves, then
dequantizes as the type does. ``to_x4`` repacks a weight in place where it may be (its rows whole groups, the kernels
built); a weight read as embeddings is never repacked (an embedding lookup reads rows one by one)."""
from __future__ import annotations

import torch

from npu_ops.quant_gguf import BLOCK_TYPES, BlockType, GgufWeight, register

ROWS = 4
X4_OF = {"Q4_0": "Q4_0x4", "Q4_1": "Q4_1x4", "Q4_1F": "Q4_1Fx4"}
SCALE_BYTES = {name: BLOCK_TYPES[name].block_bytes - 16 for name in X4_OF}  # a block's bytes before its nibbles


def interleave(data: torch.Tensor, sb: int) -> torch.Tensor:
    """uint8 [n, blocks * (sb + 16)] (GGUF's rows, n a multiple of 4) -> the same bytes 4 rows interleaved."""
    n, rb = data.shape
    b = data.reshape(n // ROWS, ROWS, rb // (sb + 16), sb + 16).transpose(1, 2)  # [groups, blocks, 4 rows, bytes]
    return torch.cat([b[..., :sb].reshape(*b.shape[:2], ROWS * sb), b[..., sb:].reshape(*b.shape[:2], ROWS * 16)],
                     dim=-1).reshape(n, rb)


def deinterleave(data: torch.Tensor, sb: int) -> torch.Tensor:
    """``interleave``'s inverse: GGUF's rows."""
    n, rb = data.shape
    steps = data.reshape(n // ROWS, rb // (sb + 16), ROWS * (sb + 16))
    scales = steps[..., :ROWS * sb].reshape(*steps.shape[:2], ROWS, sb)
    quants = steps[..., ROWS * sb:].reshape(*steps.shape[:2], ROWS, 16)
    return torch.cat([scales, quants], dim=-1).transpose(1, 2).reshape(n, rb)


def _dequantizer(base: BlockType, sb: int):  # noqa: ANN202 (a quant_gguf.Dequantizer)
    def dequantize(raw: torch.Tensor) -> torch.Tensor:
        if raw.dim() != 2 or raw.shape[0] % ROWS:
            raise ValueError(f"{base.name}x4 data must be whole groups of {ROWS} rows, got {tuple(raw.shape)}")
        return base.dequantize(deinterleave(raw, sb))
    return dequantize


def _register() -> None:
    for name, x4 in X4_OF.items():
        base = BLOCK_TYPES[name]
        low = name.lower()
        register(BlockType(x4, -1, base.block_size, base.block_bytes, _dequantizer(base, SCALE_BYTES[name]),
                           f"gguf_matmul_{low}x4", base.row_kernel, f"gguf_matmul_{low}x4_q8", ROWS, name))


def to_x4(w: GgufWeight) -> bool:
    """Repack ``w`` (a linear's weight, never an embedding's) 4 rows interleaved, in place, where its type has the
    layout, its rows are whole groups and the CPU kernels have its entry points; whether it did."""
    from npu_ops import gguf_cpu
    x4 = X4_OF.get(w.kind)
    if x4 is None or w.shape[0] % ROWS or w.data.device.type != "cpu" or gguf_cpu.runnable(x4) is not None:
        return False
    w.data, w.kind = interleave(w.data, SCALE_BYTES[w.kind]), x4
    return True


_register()

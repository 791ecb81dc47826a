"""W4A16 on the accelerators: ``Int4Linear`` keeps an ``npu_ops.quant_w4a16.Int4Weight`` int4 and runs it with the
device's weight-only int4 matmul; elsewhere (or where a shape is outside an op's contract) the reference,
``F.linear(x, weight.dequantize())``.

- CUDA: ``torch.ops.aten._convert_weight_to_int4pack(uint8 [n, k / 2], inner_k_tiles)`` (two values a byte, the
  first in the high nibble) and ``_weight_int4pack_mm(x bf16 [m, k], packed, group, scales_and_zeros)`` with
  scales_and_zeros bf16 [k / group, n, 2] and the value ``(q - 8) * scale + zero``: our ``(q - z) * scale`` with
  zero = (8 - z) * scale. group is 32, 64, 128 or 256 (a channel-wise weight's one scale is repeated per 128 or
  fewer columns: the same values), k a multiple of inner_k_tiles * 16, n of 8. Activations and scales run in
  bf16 (the op's contract), so the result is the reference's within bf16 rounding.
- Ascend: ``torch_npu.npu_weight_quant_batchmatmul(x, weight, antiquant_scale, antiquant_offset,
  antiquant_group_size=group)`` with int4 weights as int32 [k, n / 8] (``npu_convert_weight_to_int4pack`` of the
  signed values q - 8, [k, n]), scale and offset [groups, n] in x's dtype, and the value ``(w + offset) * scale``:
  offset = 8 - z (None when symmetric). A channel-wise weight passes 1-D [n] scale and offset and group 0."""
from __future__ import annotations

import importlib
import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from npu_ops.quant_w4a16 import Int4Weight

logger = logging.getLogger(__name__)

CUDA_GROUPS = (256, 128, 64, 32)


def _aten() -> Any:
    return torch.ops.aten


def _torch_npu() -> Any:
    return importlib.import_module("torch_npu")


def cuda_group(w: Int4Weight) -> int | None:
    """The op's group size that expresses ``w``'s groups (None: none does)."""
    if w.shape[1] % w.group_size:  # a shorter last group
        return None
    return next((g for g in CUDA_GROUPS if w.group_size % g == 0), None)


def cuda_pack(w: Int4Weight, device: torch.device) -> tuple[torch.Tensor, int, torch.Tensor] | None:
    """(packed weight, group, scales_and_zeros) for ``_weight_int4pack_mm``; None outside its contract."""
    n, k = w.shape
    g = cuda_group(w)
    tiles = next((t for t in (8, 4, 2) if k % (t * 16) == 0), None)
    if g is None or tiles is None or n % 8:
        return None
    q = w.q.to(device)
    packed = _aten()._convert_weight_to_int4pack((q[:, 0::2] << 4 | q[:, 1::2]).contiguous(), tiles)
    rep = w.group_size // g
    scale = w.scale.repeat_interleave(rep, dim=1)
    zero = torch.zeros_like(scale) if w.zero is None else (8 - w.zero.repeat_interleave(rep, dim=1)) * scale
    sz = torch.stack([scale.T, zero.T], dim=-1).to(device=device, dtype=torch.bfloat16).contiguous()
    return packed, g, sz


def npu_pack(w: Int4Weight, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...] | None:
    """(weight int32 [k, n / 8], scale, offset or None, group) for ``npu_weight_quant_batchmatmul``; None outside
    its contract (a shorter last group, n not a multiple of 8)."""
    if w.shape[1] % w.group_size or w.shape[0] % 8:
        return None
    signed = (w.q.to(torch.int32) - 8).T.contiguous().to(device)
    weight = _torch_npu().npu_convert_weight_to_int4pack(signed)
    channel = w.scale.shape[1] == 1
    scale = (w.scale[:, 0] if channel else w.scale.T).contiguous()
    off = None if w.zero is None else (8 - w.zero[:, 0] if channel else (8 - w.zero).T).contiguous()
    group = 0 if channel else w.group_size
    return (weight, scale.to(device, dtype), None if off is None else off.to(device, dtype), group)


class Int4Linear(nn.Module):
    """A linear layer over an int4 weight for the accelerators (the CPU's is a GgufLinear over blocks)."""

    def __init__(self, weight: Int4Weight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.weight_q = weight
        self.out_features, self.in_features = weight.shape
        self.register_buffer("bias", None if bias is None else bias.detach().contiguous())
        self._dev: dict[tuple[str, torch.dtype], Any] = {}
        self.path = "reference"

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, group={self.weight_q.group_size}, path={self.path}"

    def _packed(self, x: torch.Tensor) -> Any:
        key = (str(x.device), x.dtype)
        if key not in self._dev:
            dev = x.device.type
            self._dev[key] = (cuda_pack(self.weight_q, x.device) if dev == "cuda"
                              else npu_pack(self.weight_q, x.device, x.dtype) if dev == "npu" else None)
            self.path = dev if self._dev[key] is not None else "reference"
        return self._dev[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return self.forward(x.reshape(-1, x.shape[-1])).view(*x.shape[:-1], self.out_features)
        p = self._packed(x)
        if p is None:
            return self.reference(x)
        if x.device.type == "cuda":
            packed, g, sz = p
            y = _aten()._weight_int4pack_mm(x.to(torch.bfloat16).contiguous(), packed, g, sz).to(x.dtype)
        else:
            weight, scale, off, group = p
            y = _torch_npu().npu_weight_quant_batchmatmul(x, weight, scale, antiquant_offset=off,
                                                          antiquant_group_size=group)
        return y if self.bias is None else y + self.bias.to(y)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight_q.dequantize().to(x.device)
        b = None if self.bias is None else self.bias.to(x.device).float()
        return F.linear(x.float(), w, b).to(x.dtype)

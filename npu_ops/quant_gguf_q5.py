"""GGUF's Q5_0 and Q5_1 block types kept as the file stores them, plugged into ``npu_ops.quant_gguf``'s table.

llama.cpp writes a tensor whose rows are not whole 256-value super-blocks (SmolLM2-360M's width 960) in a 32-value
type instead: most of such a model's "Q4_K_M" file is Q5_0 and of its "Q5_K_M" Q5_1. Q5_0 is 22 bytes a block (fp16
d, qh: 4 bytes holding each value's fifth bit, qs: 16 bytes of nibbles; w = d * (q - 16)), Q5_1 24 (fp16 d, fp16 m,
qh, qs; w = d * q + m); value j's nibble is byte j's low one for j < 16, byte j - 16's high one after, its fifth bit
qh's bit j. The dequantizers here equal ``gguf.quants.dequantize`` bit for bit (d * q is exact in fp32, so each value
rounds once). The C kernels (csrc/gemm_gguf_q5.c: fp32 activations, weights decoded in registers;
csrc/gemm_gguf_q5_q8.c: int8 activations per 16 columns, ``quant_gguf.matmul_q8_ref``) take the table's contract,
so GgufLinear's segments, the fused decoder, bursts, speculation and LoRA run them as they run Q4_0 and Q4_1."""
from __future__ import annotations

import logging

import torch

from npu_ops import quant_gguf

logger = logging.getLogger(__name__)

_BITS = torch.arange(8, dtype=torch.uint8)


def _quants(b: torch.Tensor, qh_at: int) -> torch.Tensor:
    """Blocks [..., blocks, bytes] -> their 32 quants (0-31) [..., blocks, 32]: the nibbles, each with its qh bit."""
    qh = ((b[..., qh_at:qh_at + 4].unsqueeze(-1) >> _BITS) & 1).flatten(-2)  # bit j of the little-endian word
    return quant_gguf._nibbles(b[..., qh_at + 4:qh_at + 20]) | (qh << 4)


def dequantize_q5_0(raw: torch.Tensor) -> torch.Tensor:
    b = quant_gguf._blocks(raw, 22)
    w = quant_gguf._f16(b[..., 0:2]) * (_quants(b, 2).to(torch.int8) - 16).float()
    return w.reshape(*raw.shape[:-1], -1)


def dequantize_q5_1(raw: torch.Tensor) -> torch.Tensor:
    b = quant_gguf._blocks(raw, 24)
    w = quant_gguf._f16(b[..., 0:2]) * _quants(b, 4).float() + quant_gguf._f16(b[..., 2:4])
    return w.reshape(*raw.shape[:-1], -1)


quant_gguf.register(quant_gguf.BlockType("Q5_0", 6, 32, 22, dequantize_q5_0, "gguf_matmul_q5_0", "gguf_dequant_q5_0",
                                         "gguf_matmul_q5_0_q8"))
quant_gguf.register(quant_gguf.BlockType("Q5_1", 7, 32, 24, dequantize_q5_1, "gguf_matmul_q5_1", "gguf_dequant_q5_1",
                                         "gguf_matmul_q5_1_q8"))

"""W4A16 weights (issue 44): int4 values with a scale (and a zero point) per group of input columns, kept int4.

``Int4Weight`` is the one in-memory form every W4A16 checkpoint reader produces (models/w4a16_checkpoint.py):
``q`` uint8 [n, k] holding 0..15, ``scale`` fp32 [n, groups], ``zero`` fp32 [n, groups] in q's unsigned domain
(None: symmetric, the zero is 8), ``group_size`` columns a group (k: one group a row, channel-wise; the last group
of a row may be shorter, as SmolLM2-135M's 576 columns are 4.5 groups of 128). Its value,
the reference every path is held to, is ``(q - zero) * scale``, computed exactly and rounded once to fp32
(``dequantize``); with fp16 or bf16 scales and integer zeros that is the exact product.

On the CPU the weight runs through the GGUF block kernels (csrc/gemm_gguf.c): ``to_blocks`` repacks each group
into blocks of 32 values that share its scale, picking the smallest block type that holds the values exactly:
- Q4_0 (18 bytes: fp16 d, nibbles; w = d (q - 8)): symmetric, every scale exact in fp16 (fp16 scales, and bf16
  ones inside fp16's range);
- Q4_1 (20 bytes: fp16 d and min; w = fma(d, q, min)): asymmetric, scale and -scale * zero exact in fp16;
- Q4_1F (24 bytes, ours: fp32 d and min): the rest (a bf16 or fp32 scale fp16 cannot hold, a min fp16 rounds).
So the packed weight's values are the reference's bit for bit (for fp32 scales with more than 20 significant bits
and a zero point, within one fp32 rounding of -scale * zero), and only the order of fp32 sums differs.

``quantize_rtn`` is ``quantization: w4a16``'s requantization of a float checkpoint: round to nearest, per group of
128 columns, asymmetric (scale = (max - min) / 15 rounded up to 7 significant bits, so -scale * zero is exact in
fp16 and the blocks are Q4_1, 5 bits a weight; zero = clamp(round(-min / scale), 0, 15), q = clamp(round(w /
scale) + zero, 0, 15)); symmetric on request (scale = absmax / 7 in fp16, q = clamp(round(w / scale), -8, 7) + 8:
Q4_0, 4.5 bits a weight). Asymmetric was chosen by measurement: SmolLM2-135M's weights (its Q4_1 file
dequantized) requantized both ways, 511 teacher-forced corpus tokens against those fp32 weights: asymmetric top-1
agreement 0.687, mean KL 0.30, NLL 3.87 -> 4.03, weights' relative error 0.105 (mean over the linears); symmetric
0.616, 0.50, 3.87 -> 4.11, 0.125."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from npu_ops.quant_gguf import GgufWeight

logger = logging.getLogger(__name__)

GROUP = 128  # quantization: w4a16's group size
QK = 32  # values a block of the CPU kernels' types
ASYM_SCALE_BITS = 7  # an asymmetric scale's significant bits (quantize_rtn): 7 + 4 (the zero) fit fp16's 11
FP16_TINY = 2.0 ** -24  # the smallest positive fp16 (a subnormal)


@dataclass
class Int4Weight:
    """A linear weight [n, k] in W4A16: see the module's docstring."""
    q: torch.Tensor  # uint8 [n, k], 0..15
    scale: torch.Tensor  # fp32 [n, groups]
    zero: torch.Tensor | None  # fp32 [n, groups] in q's domain; None: symmetric (8)
    group_size: int

    def __post_init__(self) -> None:
        n, k = self.q.shape
        g = self.group_size
        if self.q.dtype != torch.uint8 or g <= 0:
            raise ValueError(f"an int4 weight needs uint8 values and a group size: got {self.q.dtype} "
                             f"{tuple(self.q.shape)} in groups of {g}")
        want = (n, -(-k // g))
        self.scale = self.scale.float().reshape(want) if self.scale.numel() == want[0] * want[1] else self.scale
        if tuple(self.scale.shape) != want or (self.zero is not None and self.zero.numel() != self.scale.numel()):
            raise ValueError(f"an int4 weight [{n}, {k}] in groups of {g} needs scales (and zero points) of shape "
                             f"{list(want)}, got {tuple(self.scale.shape)}"
                             f"{'' if self.zero is None else f' and {tuple(self.zero.shape)}'}")
        if self.zero is not None:
            self.zero = self.zero.float().reshape(want)

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.q.shape[0]), int(self.q.shape[1])

    @property
    def symmetric(self) -> bool:
        return self.zero is None

    def full(self, t: torch.Tensor) -> torch.Tensor:
        """A per-group tensor [n, groups] spread over every column [n, k]."""
        return t.repeat_interleave(self.group_size, dim=1)[:, :self.q.shape[1]]

    def dequantize(self) -> torch.Tensor:
        """fp32 [n, k]: (q - zero) * scale, rounded once (float64 holds it exactly for 4-bit q and an integer
        zero against an fp32 scale)."""
        z = 8.0 if self.zero is None else self.full(self.zero).double()
        return ((self.q.double() - z) * self.full(self.scale).double()).float()


def cat_rows(ws: list[Int4Weight]) -> Int4Weight:
    """Shards of one projection (q, k, v) stacked along the output: one weight, the same values."""
    if len({w.group_size for w in ws}) != 1:
        raise ValueError(f"int4 shards of one projection must share a group size, got {[w.group_size for w in ws]}")
    zero = None if all(w.zero is None for w in ws) else torch.cat(
        [torch.full_like(w.scale, 8.0) if w.zero is None else w.zero for w in ws])
    return Int4Weight(torch.cat([w.q for w in ws]), torch.cat([w.scale for w in ws]), zero, ws[0].group_size)


def _fp16_exact(t: torch.Tensor) -> bool:
    h = t.half().float()
    return bool(torch.isfinite(h).all() and torch.equal(h, t.float()))


def block_kind(w: Int4Weight) -> str:
    """The CPU block type that holds ``w``'s values exactly (the module docstring's order)."""
    if w.zero is None:
        return "Q4_0" if _fp16_exact(w.scale) else "Q4_1F"
    return "Q4_1" if _fp16_exact(w.scale) and _fp16_exact(-w.scale * w.zero) else "Q4_1F"


def blocks_unfit(w: Int4Weight) -> str | None:
    """Why ``w`` cannot be repacked into blocks of 32 (None: it can)."""
    k = w.shape[1]
    if k % QK or w.group_size % QK:
        return f"a group of {w.group_size} columns in rows of {k} is not whole blocks of {QK}"
    return None


def to_blocks(w: Int4Weight, kind: str | None = None) -> GgufWeight:
    """``w`` repacked once into CPU blocks (``block_kind``'s type unless ``kind`` names one) with the same values:
    each block of 32 takes its group's scale (and min); block j's value i < 16 is byte i's low nibble, i >= 16
    byte i - 16's high nibble (ggml's order)."""
    why = blocks_unfit(w)
    if why is not None:
        raise ValueError(why)
    kind = kind or block_kind(w)
    n, k = w.shape
    nb = k // QK
    per = w.group_size // QK  # blocks a group
    q = w.q.reshape(n, nb, QK)
    qs = (q[..., :16] | (q[..., 16:] << 4)).contiguous()  # [n, nb, 16]
    s = w.scale.repeat_interleave(per, dim=1)[:, :nb]  # [n, nb]
    if kind == "Q4_0":
        head = [s.half().reshape(n, nb, 1).view(torch.uint8)]
    else:
        mn = -s * (8.0 if w.zero is None else w.zero.repeat_interleave(per, dim=1)[:, :nb])
        hdt = torch.half if kind == "Q4_1" else torch.float32
        head = [t.to(hdt).reshape(n, nb, 1).view(torch.uint8) for t in (s, mn)]
    data = torch.cat([*head, qs], dim=-1).reshape(n, -1)
    return GgufWeight(data.contiguous(), kind, (n, k))


def _round_up_bits(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``x`` (> 0) rounded up to ``bits`` significant bits."""
    m, e = torch.frexp(x)
    return torch.ldexp(torch.ceil(m * 2.0 ** bits) / 2.0 ** bits, e)


def quantize_rtn(w: torch.Tensor, group_size: int = GROUP, symmetric: bool = False,
                 scale_dtype: torch.dtype = torch.float16) -> Int4Weight:
    """Round-to-nearest int4 per group of ``group_size`` columns (the module docstring's rules), the scales rounded
    to ``scale_dtype`` (as a checkpoint stores them) before the values are rounded against them."""
    n, k = w.shape
    pad = -k % group_size  # a shorter last group: zeros do not move its absmax, min or max
    g = F.pad(w.detach().float(), (0, pad)).reshape(n, -1, group_size)
    if symmetric:
        scale = (g.abs().amax(-1) / 7).clamp(min=FP16_TINY).to(scale_dtype).float()
        q = torch.round(g / scale[..., None]).clamp_(-8, 7) + 8
        zero = None
    else:
        lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
        # up to 7 significant bits, so -scale * zero (zero < 16) is exact in fp16: Q4_1 blocks, not Q4_1F
        scale = _round_up_bits(((hi - lo) / 15).clamp(min=FP16_TINY), ASYM_SCALE_BITS).to(scale_dtype).float()
        zero = torch.round(-lo / scale).clamp_(0, 15)
        q = (torch.round(g / scale[..., None]) + zero[..., None]).clamp_(0, 15)
    return Int4Weight(q.reshape(n, -1)[:, :k].to(torch.uint8).contiguous(), scale, zero, group_size)


def nibbles_low_first(packed: torch.Tensor, k: int) -> torch.Tensor:
    """uint8 [n, k]: bytes [n, k / 2] (or int32 words viewed as their little-endian bytes) read two values a byte,
    the low nibble first (compressed-tensors' and msModelSlim's order along a row)."""
    b = packed.contiguous().reshape(-1).view(torch.uint8).reshape(packed.shape[0], -1)
    out = torch.stack((b & 0x0F, b >> 4), dim=-1).reshape(b.shape[0], -1)
    return out[:, :k].contiguous()


def pack_low_first(q: torch.Tensor) -> torch.Tensor:
    """uint8 [n, k] (0..15) -> uint8 [n, k / 2], two values a byte, the low nibble first (``nibbles_low_first``'s
    inverse)."""
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()

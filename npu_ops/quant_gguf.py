"""GGUF block-quantized weights kept as the file stores them: the type table, the weight value and its PyTorch
reference.

A GGUF linear weight W [n_out, k] of a block type is n_out rows of k / block_size consecutive blocks, each
``block_bytes`` long (ggml's layout, read from the file as it is). ``BLOCK_TYPES`` is the one table of the types we
know: per type its block size and bytes, its dequantizer (uint8 [..., blocks * block_bytes] -> fp32 [..., blocks *
block_size], equal to ``gguf.quants.dequantize``), and the names of its C kernels in npu_ops/csrc, where there are
some:

- ``kernel``: ``void gguf_matmul_<type>(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t m,
  float *y)``, y[m, n_out] = x[m, k] . W^T, W as stored (or repacked once at load, with the same values). It must
  run on the calling thread alone when called inside an OpenMP team (the fused decoder's, csrc/gguf_linear.c's;
  omp_get_level() > 0, a team of one included).
- ``row_kernel``: ``void gguf_dequant_<type>(const uint8_t *w, int64_t k, float *out)``, one row dequantized with
  the dequantizer's values (an embedding row in the fused decode step); None keeps those steps on the op-by-op path.
- ``kernel_q8``: ``kernel``'s signature and contract, against int8 activations: each row of x quantized inside the
  call per group of columns (16 for these types: llama.cpp's Q8_0 rule on half a block; Q8_K per 256 for the
  K-quants: ``quantize_q8``, ``q8_columns``), exact integer block sums. Fewer instructions per weight, so a bandwidth-bound decode step runs
  faster; ``matmul_q8_ref`` is its reference (a GgufLinear takes it in the step kinds its ``int8_steps`` names).

A type with a kernel runs packed (``npu_ops.gguf_modules``); one without is dequantized at load. More types plug in
with ``register`` (the K-quants: ``npu_ops.quant_gguf_kquant``; Q5_0 and Q5_1: ``npu_ops.quant_gguf_q5``; loaded
through ``PLUGINS`` when present). The
reference (``matmul_ref``) is ``x @ dequantize(W).T`` in fp32; the kernels are held to it within an fp32 GEMM's
error bound (npu_ops.linear.fp32_gemm_tolerance), their weights being the dequantized values exactly."""
from __future__ import annotations

import importlib
import importlib.util
import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

logger = logging.getLogger(__name__)

Dequantizer = Callable[[torch.Tensor], torch.Tensor]
# modules that register more block types, imported when present
PLUGINS = ("npu_ops.quant_gguf_kquant", "npu_ops.quant_gguf_q5", "npu_ops.quant_gguf_x4")


@dataclass(frozen=True)
class BlockType:
    name: str  # ggml's name: "Q4_0"
    ggml_type: int  # gguf.GGMLQuantizationType's value (-1: a type of ours that no GGUF file holds)
    block_size: int  # values a block
    block_bytes: int  # bytes a block
    dequantize: Dequantizer
    kernel: str | None = None  # gguf_matmul_<type> in the CPU kernels
    row_kernel: str | None = None  # gguf_dequant_<type>
    kernel_q8: str | None = None  # gguf_matmul_<type>_q8: the same against int8 activations (few rows)
    interleave: int = 1  # rows a group (4: npu_ops.quant_gguf_x4's repacked types; the row kernel reads base's rows)
    base: str | None = None  # the type whose blocks a repacked type holds (its name otherwise)

    def row_bytes(self, k: int) -> int:
        if k % self.block_size:
            raise ValueError(f"{self.name}: a row of {k} values is not whole blocks of {self.block_size}")
        return k // self.block_size * self.block_bytes


def _blocks(raw: torch.Tensor, block_bytes: int) -> torch.Tensor:
    if raw.dtype != torch.uint8 or raw.shape[-1] % block_bytes:
        raise ValueError(f"expected uint8 rows of whole {block_bytes}-byte blocks, got {raw.dtype} {tuple(raw.shape)}")
    return raw.reshape(*raw.shape[:-1], raw.shape[-1] // block_bytes, block_bytes)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Two bytes a block (little-endian fp16) -> fp32 [..., blocks, 1]."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """16 bytes -> 32 values: every byte's low nibble, then every byte's high nibble (ggml's order)."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def dequantize_q4_0(raw: torch.Tensor) -> torch.Tensor:
    b = _blocks(raw, 18)
    w = _f16(b[..., 0:2]) * (_nibbles(b[..., 2:18]).to(torch.int8) - 8).float()
    return w.reshape(*raw.shape[:-1], -1)


def dequantize_q4_1(raw: torch.Tensor) -> torch.Tensor:
    b = _blocks(raw, 20)
    w = _f16(b[..., 0:2]) * _nibbles(b[..., 4:20]).float() + _f16(b[..., 2:4])
    return w.reshape(*raw.shape[:-1], -1)


def dequantize_q4_1f(raw: torch.Tensor) -> torch.Tensor:
    """Ours, not ggml's (npu_ops/quant_w4a16.py): Q4_1 with fp32 d and min, 24 bytes a block; fma(d, q, min)
    rounds once, as the kernel's does (float64 holds d * q + min exactly at the magnitudes W4A16 gives them)."""
    b = _blocks(raw, 24)
    d, mn = b[..., 0:4].contiguous().view(torch.float32), b[..., 4:8].contiguous().view(torch.float32)
    w = (d.double() * _nibbles(b[..., 8:24]).double() + mn.double()).float()
    return w.reshape(*raw.shape[:-1], -1)


def dequantize_q8_0(raw: torch.Tensor) -> torch.Tensor:
    b = _blocks(raw, 34)
    w = b[..., 2:34].contiguous().view(torch.int8).float() * _f16(b[..., 0:2])
    return w.reshape(*raw.shape[:-1], -1)


def numpy_dequantizer(ggml_type: int) -> Dequantizer:
    """``gguf.quants.dequantize`` as a Dequantizer: any type the gguf package reads (the slow, exact fallback)."""
    def dequantize(raw: torch.Tensor) -> torch.Tensor:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize as np_dequantize
        arr = np_dequantize(raw.cpu().numpy(), GGMLQuantizationType(ggml_type))
        return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32)).to(raw.device)
    return dequantize


BLOCK_TYPES: dict[str, BlockType] = {}


def register(bt: BlockType) -> None:
    """Add or replace a block type (a K-quant with its kernels, say)."""
    BLOCK_TYPES[bt.name] = bt


register(BlockType("Q4_0", 2, 32, 18, dequantize_q4_0, "gguf_matmul_q4_0", "gguf_dequant_q4_0",
                   "gguf_matmul_q4_0_q8"))
register(BlockType("Q4_1", 3, 32, 20, dequantize_q4_1, "gguf_matmul_q4_1", "gguf_dequant_q4_1",
                   "gguf_matmul_q4_1_q8"))
register(BlockType("Q8_0", 8, 32, 34, dequantize_q8_0, "gguf_matmul_q8_0", "gguf_dequant_q8_0",
                   "gguf_matmul_q8_0_q8"))
register(BlockType("Q4_1F", -1, 32, 24, dequantize_q4_1f, "gguf_matmul_q4_1f", "gguf_dequant_q4_1f",
                   "gguf_matmul_q4_1f_q8"))  # W4A16's

_plugins_loaded = False


def block_type(name: str) -> BlockType | None:
    """The table's entry for ggml type ``name`` (the plug-ins registered first); None for a type we do not run."""
    global _plugins_loaded
    if not _plugins_loaded:
        _plugins_loaded = True
        for mod in PLUGINS:
            if importlib.util.find_spec(mod) is not None:
                importlib.import_module(mod)
    return BLOCK_TYPES.get(name)


@dataclass
class GgufWeight:
    """A linear weight [n_out, k] in one GGUF block type: ``data`` uint8 [n_out, row_bytes], as the file stores it."""
    data: torch.Tensor
    kind: str  # the block type's name
    shape: tuple[int, int]  # (n_out, k)

    def __post_init__(self) -> None:
        bt = self.block_type
        n, k = self.shape
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != (n, bt.row_bytes(k)):
            raise ValueError(f"{self.kind} weight of shape {self.shape} needs uint8 [{n}, {bt.row_bytes(k)}], got "
                             f"{self.data.dtype} {tuple(self.data.shape)}")
        if n % bt.interleave:
            raise ValueError(f"{self.kind} weight of shape {self.shape}: rows come in groups of {bt.interleave}")

    @property
    def block_type(self) -> BlockType:
        bt = block_type(self.kind)
        if bt is None:
            raise ValueError(f"GGUF block type {self.kind} is not in npu_ops.quant_gguf.BLOCK_TYPES")
        return bt

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def dequantize(self) -> torch.Tensor:
        """fp32 [n_out, k]: gguf.quants.dequantize's values."""
        return self.block_type.dequantize(self.data).reshape(self.shape)

    def rows(self, idx: torch.Tensor) -> torch.Tensor:
        """fp32 [len(idx), k]: only the rows ``idx`` dequantized (an embedding lookup)."""
        if self.block_type.interleave > 1:
            raise ValueError(f"{self.kind}: rows interleaved in groups are not looked up one by one")
        return self.block_type.dequantize(self.data.index_select(0, idx.reshape(-1))).reshape(-1, self.shape[1])


def stored_kind(kind: str) -> str:
    """The GGUF type whose blocks a weight of ``kind`` holds (``kind`` itself, or a repacked type's base)."""
    bt = block_type(kind)
    return kind if bt is None or bt.base is None else bt.base


def dequantize(w: GgufWeight) -> torch.Tensor:
    return w.dequantize()


def matmul_ref(x: torch.Tensor, w: GgufWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The reference: x [M, k] @ dequantize(W).T (+ bias) in fp32."""
    y = x.float() @ w.dequantize().T
    return y if bias is None else y + bias.float()


def quantize_q8(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """The int8 activations of the ``kernel_q8`` kernels, dequantized: each row's ``block``-column groups by
    llama.cpp's Q8_0 / Q8_K rule with an fp32 scale: d = max|x| / 127, q = round-half-even(x * (1 / d)) in
    [-127, 127] -> q * d, fp32 [m, k]."""
    xb = x.float().reshape(x.shape[0], -1, block)
    d = xb.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(d != 0, 1.0 / torch.where(d != 0, d, torch.ones_like(d)), torch.zeros_like(d))
    return (torch.round(xb * inv).clamp_(-127, 127) * d).reshape(x.shape)


def q8_columns(bt: BlockType) -> int:
    """How many columns of x share a scale in ``bt``'s ``kernel_q8``: 16 for the 32-value types (half a block:
    csrc/gemm_gguf_q8.c), the K-quants' Q8_K 256."""
    return 16 if bt.block_size == 32 else bt.block_size


def matmul_q8_ref(x: torch.Tensor, w: GgufWeight) -> torch.Tensor:
    """The ``kernel_q8`` kernels' reference: x's rows quantized as the kernel does (``quantize_q8`` per
    ``q8_columns``), times the dequantized W, in fp32."""
    return matmul_ref(quantize_q8(x, q8_columns(w.block_type)), w)

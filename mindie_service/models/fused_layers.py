"""Every decoder layer of a step in one C call (npu_ops/csrc/layers_f32.c) on the CPU in fp32.

A thin model pays per op, per layer: Python dispatch, a tensor allocation, a ctypes call and a thread team
forked and joined. SmolLM2-135M (30 layers of hidden 576) spent about a third of a one-sequence decode step
there (issue 27). The C side runs the same compiled kernels as the op-by-op path, in one OpenMP team, with the
residual adds in the o/down projections' epilogues and silu(gate) * up in gate/up's, so its output is
bit-identical to that path's. A projection may hold int8 weights packed for the CPU (W8A16 or W8A8,
npu_ops/quant.py): the C loop calls the same int8 kernels as the op-by-op path (issue 27); or GGUF blocks as stored
(npu_ops/gguf_modules.py's GgufLinear: its segment table, run by csrc/gguf_linear.c's team half, issue 44). Used only where
nothing needs the op-by-op path: every projection packed for the C kernels, no LoRA, no tensor parallelism, an fp32
or int8 KV cache (the int8 rows quantized in the C loop as npu_ops/quant_kv.py does), the row metadata present.
``set_enabled(False)`` keeps every step on the op-by-op path (A/B measurements, tests)."""
from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from npu_ops import cpu_kernels, memory, quant_kv
from npu_ops.gguf_modules import GgufLinear, current_step
from npu_ops.linear import FastLinear
from npu_ops.quant import QuantLinear

logger = logging.getLogger(__name__)

_enabled = True


def set_enabled(on: bool) -> None:
    """Switch the fused path on or off for every model in this process."""
    global _enabled
    _enabled = on


def enabled() -> bool:
    return _enabled


@dataclass
class FusedLayers:
    """The pointer table of one model's layers over one KV pool, and the step's scratch."""

    key: tuple[int, ...] = ()
    usable: bool = False
    table: torch.Tensor | None = None  # int64 [layers, 21]: layers_f32.c's layer_f32 structs
    keep: list[torch.Tensor] = field(default_factory=list)  # what the table points into
    work: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    cache: Callable[[], torch.Tensor | None] = lambda: None  # a weak reference to the pool's first cache

    def refresh(self, model: Any, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
        """(Re)build the table when the model's packing or the KV pool changed; whether the fused path applies."""
        first, last = model.layers[0].self_attn.qkv_proj, model.layers[-1].mlp.down_proj
        kc = kv_caches[0][0]
        key = (id(kv_caches), kc.data_ptr(), kc.dtype, id(first.packed), id(last.packed), len(model.layers))
        # the table holds the packed weights (their ids stay theirs) but not the pool: a pool freed and another
        # allocated in its place (same id, same address, an int8 pool for an fp32 one) must not pass for it
        if key != self.key or self.cache() is not kc:
            self.key, self.cache = key, weakref.ref(kc)
            self.usable, self.table, self.keep = _build_table(model, kv_caches)
        return self.usable

    def scratch(self, floats: int) -> torch.Tensor:
        """The step's work buffer (the fused layers', and the one-call decode step's: models/fused_decode.py), grown
        to the largest step so far (a prefill of many prompts: tens of MB). A mapping of its own (memory.scratch), so
        that dropping it gives its pages back from any thread: a glibc block freed in the serve's engine thread
        would stay in that thread's arena."""
        if self.work.numel() < floats:
            self.work = torch.empty(0)  # the old one goes before the new one is mapped
            self.work = memory.scratch(floats, torch.float32)
        return self.work

    def release(self) -> None:
        """Drop the work buffer (the engine went idle): the next step allocates what it needs."""
        self.work = torch.empty(0)


_KINDS = {"w8a16": 1, "w8a8": 2}  # layers_f32.c's LIN_W8A16, LIN_W8A8 (0: fp32)
LIN_GGUF = 3  # layers_f32.c's: a GGUF segment table (npu_ops/gguf_modules.py)


def _packed(m: Any) -> bool:
    if isinstance(m, GgufLinear):
        return m.runs_on_cpu_kernels() and (m.bias is None or m.bias.dtype == torch.float32)
    if isinstance(m, QuantLinear):
        return (m.packed is not None and m.scheme in _KINDS and m.w_scale.dtype == torch.float32
                and (m.bias is None or m.bias.dtype == torch.float32))
    return isinstance(m, FastLinear) and m.packed is not None and m.packed_kind == "csrc"


def _lin_row(m: Any, ptr: Any) -> list[int]:
    """One layers_f32.c lin_desc: packed weight, bias, scale, kind."""
    if isinstance(m, GgufLinear):
        return [ptr(m.segments()), ptr(m.bias), 0, LIN_GGUF]
    if isinstance(m, QuantLinear):
        return [ptr(m.packed), ptr(m.bias), ptr(m.w_scale), _KINDS[m.scheme]]
    return [ptr(m.packed), ptr(m.bias), 0, 0]


_KV_I8_MAX_D = 512  # attention_i8.h's KV_I8_MAX_D


def _cache_ok(kc: torch.Tensor, vc: torch.Tensor, kv_heads: int, head_dim: int) -> bool:
    """An fp32 cache, or an int8 one (npu_ops/quant_kv.py's rows, quantized in the C loop as quant_kv does)."""
    if not (kc.is_contiguous() and vc.is_contiguous() and kc.dtype == vc.dtype and kc.shape == vc.shape):
        return False
    if quant_kv.is_quantized(kc):
        return kc.shape[2:] == (kv_heads, quant_kv.row_bytes(head_dim)) and head_dim <= _KV_I8_MAX_D
    return kc.dtype == torch.float32 and kc.shape[2:] == (kv_heads, head_dim)


def _build_table(model: Any, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
                 ) -> tuple[bool, torch.Tensor | None, list[torch.Tensor]]:
    if cpu_kernels.load() is None:
        return False, None, []
    d = model.dims
    rows: list[list[int]] = []
    keep: list[torch.Tensor] = []

    def ptr(t: torch.Tensor | None) -> int:
        if t is None:
            return 0
        t = t.detach().contiguous()
        keep.append(t)
        return t.data_ptr()

    for layer, (kc, vc) in zip(model.layers, kv_caches):
        at, mlp = layer.self_attn, layer.mlp
        linears = (at.qkv_proj, at.o_proj, mlp.gate_up_proj, mlp.down_proj)
        if (not all(_packed(m) for m in linears) or at.reduce is not None or mlp.reduce is not None
                or not _cache_ok(kc, vc, d.kv_heads, d.head_dim) or d.head_dim % 2):
            return False, None, []
        norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
        if any(w.dtype != torch.float32 or w.device.type != "cpu" for w in norms):
            return False, None, []
        rows.append([ptr(norms[0]), ptr(norms[1]), *(v for m in linears for v in _lin_row(m, ptr)),
                     kc.data_ptr(), vc.data_ptr(), int(quant_kv.is_quantized(kc))])
    logger.info("decoder layers fused into one CPU kernel call per step (%d layers)", len(rows))
    return True, torch.tensor(rows, dtype=torch.int64), keep


def run(model: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: Any,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    """Run every layer over x [T, hidden] in place when the fused path applies; False (x untouched) where the
    op-by-op path must run."""
    meta = ctx.attn
    if (not _enabled or ctx.lora is not None or meta.row_seq is None or meta.block_tables is None
            or x.device.type != "cpu" or x.dtype != torch.float32 or not x.is_contiguous() or not x.shape[0]):
        return False
    fused: FusedLayers | None = getattr(model, "_fused_layers", None)
    if fused is None:
        fused = model._fused_layers = FusedLayers()
    if not fused.refresh(model, kv_caches):
        return False
    d, lib, kc = model.dims, cpu_kernels.load(), kv_caches[0][0]
    t = x.shape[0]
    cos, sin = cos.contiguous(), sin.contiguous()
    slots = meta.slots.to(torch.int64).contiguous()
    bt = meta.block_tables.to(torch.int32).contiguous()
    seq, pos = meta.row_seq.to(torch.int32).contiguous(), meta.row_pos.to(torch.int32).contiguous()
    work = fused.scratch(lib.llama_layers_f32_work(t, d.hidden, d.heads, d.kv_heads, d.head_dim, d.intermediate))
    assert fused.table is not None
    rc = lib.llama_layers_f32(fused.table.data_ptr(), len(model.layers), x.data_ptr(), t, d.hidden, d.heads,
                              d.kv_heads, d.head_dim, d.intermediate, float(d.eps), cos.data_ptr(), sin.data_ptr(),
                              slots.data_ptr(), bt.data_ptr(), bt.shape[0], bt.shape[1], seq.data_ptr(),
                              pos.data_ptr(), kc.shape[1], float(d.head_dim ** -0.5), work.data_ptr(),
                              torch.get_num_threads(), current_step())
    if rc != 0:
        raise RuntimeError(f"llama_layers_f32 failed with code {rc} (bad shapes, rows or positions)")
    return True

"""Megatron-style tensor parallelism, applied to a loaded Llama from outside (gpt-fast style).

Per decoder layer, rank r of w keeps:
- column-parallel ``qkv_proj``: its H/w query heads and the K/V heads those queries read (KV/w of them,
  or, when w exceeds the KV heads, the one KV head of its query group, replicated over ranks);
- column-parallel ``gate_up_proj``: its I/w slice of gate and of up;
- row-parallel ``o_proj`` and ``down_proj``: the matching input columns; their partial outputs are
  summed by ``reduce`` (an all-reduce) after LoRA deltas are added, and the bias is kept on rank 0 only.
The embedding, norms and LM head are replicated (simpler than a vocabulary-parallel head, and the
LM head runs only on rank 0, which samples: workers get no LM head at all). int8 linears
(npu_ops.quant.QuantLinear) shard with their scales: per-output-channel scales follow a column split,
a row-parallel layer keeps its full scales. Sharding runs after quantization and before packing."""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Callable

import torch
from torch import nn

from mindie_service.errors import check
from mindie_service.models.llama import LlamaDims
from npu_ops.linear import FastLinear
from npu_ops.quant import QuantLinear

logger = logging.getLogger(__name__)

Reduce = Callable[[torch.Tensor], torch.Tensor]
COLUMN = {"qkv_proj", "gate_up_proj", "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}


@dataclass(frozen=True)
class ShardPlan:
    rank: int
    world: int
    full: LlamaDims

    def __post_init__(self) -> None:
        d, w = self.full, self.world
        check(d.heads % w == 0, "worldSize", f"a divisor of the model's attention heads ({d.heads})", w)
        check(d.intermediate % w == 0, "worldSize", f"a divisor of the model's intermediate size ({d.intermediate})", w)
        check(d.kv_heads % w == 0 or w % d.kv_heads == 0, "worldSize",
              f"a divisor or a multiple of the model's KV heads ({d.kv_heads})", w)

    @property
    def local(self) -> LlamaDims:
        d, w = self.full, self.world
        return replace(d, heads=d.heads // w, kv_heads=max(1, d.kv_heads // w), intermediate=d.intermediate // w)

    def q_heads(self) -> range:
        n = self.full.heads // self.world
        return range(self.rank * n, (self.rank + 1) * n)

    def kv_heads(self) -> range:
        d = self.full
        if self.world <= d.kv_heads:
            n = d.kv_heads // self.world
            return range(self.rank * n, (self.rank + 1) * n)
        head = self.q_heads().start // (d.heads // d.kv_heads)  # the KV head of this rank's query group
        return range(head, head + 1)

    def _heads(self, heads: range, offset: int) -> list[int]:
        hd = self.full.head_dim
        return list(range(offset + heads.start * hd, offset + heads.stop * hd))

    def _inter(self, offset: int) -> list[int]:
        n = self.full.intermediate // self.world
        return list(range(offset + self.rank * n, offset + (self.rank + 1) * n))

    def out_index(self, module: str) -> list[int]:
        """Output rows this rank keeps of a column-parallel (packed or checkpoint) module."""
        d = self.full
        q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
        parts = {"q_proj": lambda: self._heads(self.q_heads(), 0), "k_proj": lambda: self._heads(self.kv_heads(), 0),
                 "v_proj": lambda: self._heads(self.kv_heads(), 0), "gate_proj": lambda: self._inter(0),
                 "up_proj": lambda: self._inter(0),
                 "qkv_proj": lambda: (self._heads(self.q_heads(), 0) + self._heads(self.kv_heads(), q)
                                      + self._heads(self.kv_heads(), q + kv)),
                 "gate_up_proj": lambda: self._inter(0) + self._inter(d.intermediate)}
        return parts[module]()

    def in_slice(self, module: str) -> slice:
        """Input columns this rank keeps of a row-parallel module (o_proj, down_proj)."""
        if module == "o_proj":
            cols = self._heads(self.q_heads(), 0)
        else:
            cols = self._inter(0)
        return slice(cols[0], cols[-1] + 1)

    # ------------------------------------------------------------ LoRA (mindie_service.lora.adapter)
    def lora_full_features(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each LoRA-able checkpoint module of the unsharded model."""
        d = self.full
        q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
        return {"q_proj": (d.hidden, q), "k_proj": (d.hidden, kv), "v_proj": (d.hidden, kv), "o_proj": (q, d.hidden),
                "gate_proj": (d.hidden, d.intermediate), "up_proj": (d.hidden, d.intermediate),
                "down_proj": (d.intermediate, d.hidden)}

    def shard_lora(self, sub: str, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A [r, in], B [out, r] of a full adapter module -> this rank's: a column-parallel module keeps
        A and its rows of B; a row-parallel one its columns of A and all of B (the partial deltas are
        summed by the layer's all-reduce)."""
        if sub in COLUMN:
            return a, b[torch.tensor(self.out_index(sub))].contiguous()
        return a[:, self.in_slice(sub)].contiguous(), b


class NoLogits(nn.Module):
    """A worker's LM head: only rank 0 computes logits and samples."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.new_empty(hidden.shape[0], 0)


def _column(m: nn.Module, idx: list[int]) -> nn.Module:
    rows = torch.tensor(idx, device=_device(m))
    bias = None if m.bias is None else m.bias.detach()[rows]
    if isinstance(m, QuantLinear):
        static = {k: _rows_if_channel(getattr(m, k), rows, m.out_features) for k in m.static_names}
        return QuantLinear(m.in_features, len(idx), m.scheme, m.qweight[rows], m.w_scale[rows], bias, static or None)
    out = FastLinear(m.in_features, len(idx), bias=bias is not None, device=_device(m), dtype=m.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(m.weight[rows])
        if bias is not None:
            out.bias.copy_(bias)
    return out


def _row(m: nn.Module, cols: slice, first: bool) -> nn.Module:
    n = cols.stop - cols.start
    bias = m.bias.detach() if m.bias is not None and first else None  # added once, on rank 0
    if isinstance(m, QuantLinear):
        static = {k: getattr(m, k) for k in m.static_names}
        if "quant_bias" in static and not first:
            static["quant_bias"] = torch.zeros_like(static["quant_bias"])
        return QuantLinear(n, m.out_features, m.scheme, m.qweight[:, cols], m.w_scale, bias, static or None)
    out = FastLinear(n, m.out_features, bias=m.bias is not None, device=_device(m), dtype=m.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(m.weight[:, cols])
        if out.bias is not None:
            out.bias.copy_(bias if bias is not None else torch.zeros_like(out.bias))
    return out


def _rows_if_channel(t: torch.Tensor, rows: torch.Tensor, out_features: int) -> torch.Tensor:
    """msModelSlim's static buffers: per-output-channel ones follow the column split, per-tensor ones stay."""
    return t.reshape(-1)[rows].reshape(-1) if t.numel() == out_features else t


def _device(m: nn.Module) -> torch.device:
    return next(iter(m.buffers() if isinstance(m, QuantLinear) else m.parameters())).device


def shard_model(model: nn.Module, rank: int, world: int, reduce: Reduce) -> ShardPlan:
    """Keep rank ``rank``'s shard of every decoder layer of ``model`` (in place) and set ``reduce`` on the
    row-parallel outputs. ``model.dims`` becomes the local shape (the KV pool and LoRA pool follow it)."""
    plan = ShardPlan(rank, world, model.dims)
    local = plan.local
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_proj = _column(attn.qkv_proj, plan.out_index("qkv_proj"))
        attn.o_proj = _row(attn.o_proj, plan.in_slice("o_proj"), rank == 0)
        attn.d, attn.q_size, attn.kv_size = local, local.heads * local.head_dim, local.kv_heads * local.head_dim
        mlp.gate_up_proj = _column(mlp.gate_up_proj, plan.out_index("gate_up_proj"))
        mlp.down_proj = _row(mlp.down_proj, plan.in_slice("down_proj"), rank == 0)
        attn.reduce = mlp.reduce = reduce
    model.dims = local
    model.tp_plan = plan
    if rank != 0:
        model.lm_head = NoLogits()
    logger.info("rank %d/%d: %d query heads, %d KV heads (%s), intermediate %d", rank, world, local.heads,
                local.kv_heads, "replicated" if world > plan.full.kv_heads else "split", local.intermediate)
    return plan

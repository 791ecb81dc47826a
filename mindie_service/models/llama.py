"""The Llama family (Llama, Mistral, Qwen2 with qkv bias) over a paged KV cache.

Tokens of one step are packed flat ([T, hidden]); only attention knows about sequences, through
``AttentionMetadata``. q/k/v and gate/up are packed into one matmul each. LoRA deltas and media
embeddings are applied from outside through ``StepContext`` hooks, not woven into the layers."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch
from torch import nn

from mindie_service.models import fused_layers
from npu_ops.linear import FastLinear
from npu_ops.ops import AttentionMetadata, add_rms_norm, paged_attention, rms_norm, rotary, silu_mul, write_kv


class LoraApplier(Protocol):
    """Adds per-token LoRA deltas to a projection's output (see mindie_service.lora)."""

    def apply(self, layer: int, module: str, x: torch.Tensor, out: torch.Tensor) -> None: ...


@dataclass
class StepContext:
    positions: torch.Tensor  # [T]
    attn: AttentionMetadata
    lora: LoraApplier | None = None
    # Media embeddings spliced over placeholder tokens: (token indices [M], embeddings [M, hidden]).
    embeds_override: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass(frozen=True)
class LlamaDims:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: int
    vocab: int
    eps: float
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    tie_embeddings: bool

    @classmethod
    def from_hf(cls, cfg: Any, qkv_bias: bool | None = None) -> "LlamaDims":
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        attn_bias = bool(getattr(cfg, "attention_bias", False))
        return cls(hidden=cfg.hidden_size, heads=heads, kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
                   head_dim=head_dim, intermediate=cfg.intermediate_size, layers=cfg.num_hidden_layers,
                   vocab=cfg.vocab_size, eps=cfg.rms_norm_eps,
                   qkv_bias=attn_bias if qkv_bias is None else qkv_bias, o_bias=attn_bias,
                   mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
                   tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, d: LlamaDims, layer: int) -> None:
        super().__init__()
        self.d, self.layer = d, layer
        self.q_size, self.kv_size = d.heads * d.head_dim, d.kv_heads * d.head_dim
        self.qkv_proj = FastLinear(d.hidden, self.q_size + 2 * self.kv_size, bias=d.qkv_bias)
        self.o_proj = FastLinear(self.q_size, d.hidden, bias=d.o_bias)
        self.scale = d.head_dim ** -0.5
        self.reduce: Callable[[torch.Tensor], torch.Tensor] | None = None  # tensor parallel (models/shard.py)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: StepContext,
                kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        d = self.d
        qkv = self.qkv_proj(x)
        if ctx.lora is not None:
            ctx.lora.apply(self.layer, "qkv_proj", x, qkv)
        # q's and k's heads sit side by side in each row of qkv: one rotary call turns both (issue 27: one op
        # and one kernel call fewer per layer, where a thin model's per-op costs add up over its layers).
        qk = rotary(qkv[:, :self.q_size + self.kv_size].view(-1, d.heads + d.kv_heads, d.head_dim), cos, sin)
        q, k = qk[:, :d.heads], qk[:, d.heads:]
        v = qkv[:, self.q_size + self.kv_size:].reshape(-1, d.kv_heads, d.head_dim)
        write_kv(kv[0], kv[1], k, v, ctx.attn.slots)
        o = paged_attention(q, k, v, kv[0], kv[1], ctx.attn, self.scale).reshape(-1, self.q_size)
        out = self.o_proj(o)
        if ctx.lora is not None:
            ctx.lora.apply(self.layer, "o_proj", o, out)
        return out if self.reduce is None else self.reduce(out)  # row-parallel: after the LoRA delta


class MLP(nn.Module):
    def __init__(self, d: LlamaDims, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.gate_up_proj = FastLinear(d.hidden, 2 * d.intermediate, bias=d.mlp_bias)
        self.down_proj = FastLinear(d.intermediate, d.hidden, bias=d.mlp_bias)
        self.reduce: Callable[[torch.Tensor], torch.Tensor] | None = None  # tensor parallel (models/shard.py)

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        gu = self.gate_up_proj(x)
        if ctx.lora is not None:
            ctx.lora.apply(self.layer, "gate_up_proj", x, gu)
        h = silu_mul(gu)
        out = self.down_proj(h)
        if ctx.lora is not None:
            ctx.lora.apply(self.layer, "down_proj", h, out)
        return out if self.reduce is None else self.reduce(out)


class DecoderLayer(nn.Module):
    def __init__(self, d: LlamaDims, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(d.hidden, d.eps)
        self.self_attn = Attention(d, layer)
        self.post_attention_layernorm = RMSNorm(d.hidden, d.eps)
        self.mlp = MLP(d, layer)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: StepContext,
                kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        norm = self.post_attention_layernorm
        # the residual add and the next norm: one kernel where Triton runs, the add then the norm elsewhere
        h, x = add_rms_norm(self.self_attn(self.input_layernorm(x), cos, sin, ctx, kv), x, norm.weight, norm.eps)
        return x + self.mlp(h, ctx)


def embedding(vocab: int, hidden: int) -> nn.Embedding:
    """nn.Embedding, without its random init when built on the meta device (the loader's case, which fills it from
    the checkpoint): on meta, ``init.normal_`` runs through torch._refs, which imports torch._dynamo and triton
    (~110 MB resident, issue 44) to draw nothing."""
    w = torch.empty(vocab, hidden)
    return nn.Embedding(vocab, hidden, _weight=w) if w.is_meta else nn.Embedding(vocab, hidden)


class LlamaForCausalLM(nn.Module):
    """Parameter names follow Hugging Face's with q/k/v and gate/up packed (see PACKED)."""

    # checkpoint sub-module -> (our packed module, shard index)
    PACKED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
              "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}

    def __init__(self, d: LlamaDims, rope_cos: torch.Tensor, rope_sin: torch.Tensor) -> None:
        super().__init__()
        self.dims = d
        self.embed_tokens = embedding(d.vocab, d.hidden)
        self.layers = nn.ModuleList(DecoderLayer(d, i) for i in range(d.layers))
        self.norm = RMSNorm(d.hidden, d.eps)
        self.lm_head = FastLinear(d.hidden, d.vocab, bias=False)
        self.register_buffer("rope_cos", rope_cos, persistent=False)
        self.register_buffer("rope_sin", rope_sin, persistent=False)

    def shard_sizes(self, packed: str) -> list[int]:
        d = self.dims
        if packed == "qkv_proj":
            return [d.heads * d.head_dim, d.kv_heads * d.head_dim, d.kv_heads * d.head_dim]
        return [d.intermediate, d.intermediate]

    def embed(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        if ctx.embeds_override is not None:
            idx, emb = ctx.embeds_override
            x = x.index_copy(0, idx, emb.to(x.dtype))
        return x

    def forward(self, input_ids: torch.Tensor, ctx: StepContext,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Returns the final hidden states [T, hidden] (logits are computed for chosen rows only)."""
        x = self.embed(input_ids, ctx)
        cos, sin = self.rope_cos[ctx.positions], self.rope_sin[ctx.positions]
        if fused_layers.run(self, x, cos, sin, ctx, kv_caches):  # every layer in one C call (CPU, fp32 activations; fp32 or int8 weights)
            return self.norm(x)
        for layer, kv in zip(self.layers, kv_caches):
            x = layer(x, cos, sin, ctx, kv)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()


class LlamaForScore(LlamaForCausalLM):
    """LlamaForSequenceClassification: the decoder with a ``num_labels``-wide score head (no bias) in place of the
    LM head; its "logits" are the scores, read at a sequence's last token (models/pooling_spec.py)."""

    def __init__(self, d: LlamaDims, rope_cos: torch.Tensor, rope_sin: torch.Tensor, num_labels: int) -> None:
        super().__init__(dataclasses.replace(d, tie_embeddings=False), rope_cos, rope_sin)
        self.num_labels = num_labels
        self.lm_head = FastLinear(d.hidden, num_labels, bias=False)

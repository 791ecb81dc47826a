"""RoPE cos / sin tables for every position up to the model's limit, equal bit for bit to the family's transformers
rotary class (``ModelFamily.rotary_class``) without importing its modeling module where the tables do not depend on
the positions asked for. Importing ``transformers.models.llama.modeling_llama`` pulls in transformers' generation
code, torch._dynamo, triton and sympy: ~140 MB of resident memory that a serve never uses (issue 44: RSS after load).
The rotary classes of Llama, Mistral and Qwen2 compute ``inv_freq, scaling = init(config)`` and then
``freqs = pos[..., None].float() * inv_freq``, ``emb = cat(freqs, freqs)``, ``cos = emb.cos() * scaling``: the same
ops run here. RoPE types whose forward rescales by sequence length (dynamic, longrope) still use the class."""
from __future__ import annotations

import importlib
import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

# rope types whose rotary forward is the plain one (transformers' dynamic_rope_update acts only on dynamic / longrope)
STATIC_TYPES = ("default", "linear", "llama3", "yarn")


def rope_type(cfg: Any) -> str:
    params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    return str(params.get("rope_type", params.get("type", "default")))


def _inv_freq(cfg: Any, kind: str) -> tuple[torch.Tensor, float]:
    """The rotary class's ``rope_init_fn(config)``: its default formula, else transformers' ROPE_INIT_FUNCTIONS."""
    if kind != "default":
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        inv, scale = ROPE_INIT_FUNCTIONS[kind](cfg)
        return inv, float(scale)
    base = cfg.rope_parameters["rope_theta"]
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0


def rope_tables(rotary_class: str, cfg: Any, max_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each [max_pos, head_dim] in fp32, as ``rotary_class`` computes them for positions 0..max_pos-1."""
    pos = torch.arange(max_pos)[None]
    kind = rope_type(cfg)
    if kind not in STATIC_TYPES or getattr(cfg, "rope_parameters", None) is None:
        mod_name, cls_name = rotary_class.rsplit(".", 1)
        logger.debug("RoPE %s: tables from %s", kind, rotary_class)
        rope = getattr(importlib.import_module(mod_name), cls_name)(config=cfg)
        cos, sin = rope(torch.zeros(1, dtype=torch.float32), pos)
        return cos[0], sin[0]
    inv_freq, scale = _inv_freq(cfg, kind)
    freqs = pos[..., None].float() * inv_freq.to(dtype=torch.float)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scale)[0], (emb.sin() * scale)[0]

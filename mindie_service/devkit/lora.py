"""A random PEFT LoRA adapter for a base checkpoint (``mindie-service demo-lora``).

Writes ``adapter_config.json`` and ``adapter_model.safetensors`` that both this engine and
``peft.PeftModel.from_pretrained`` load unchanged. Deterministic: the same base, rank, seed and
targets give byte-identical files. A ~ N(0, 1/in) and B ~ N(0, (gain/scaling)^2 / r), so each
delta's output std is about ``gain`` x the input's RMS: enough to change greedy outputs clearly
while the model stays as sane as the base (the demo base projections have gain 0.5)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from mindie_service.lora.adapter import CONFIG_FILE, TARGETS, WEIGHTS_FILE

DEFAULT_TARGETS = tuple(TARGETS)  # q, k, v, o, gate, up, down


def _module_shapes(cfg: dict) -> dict[str, tuple[int, int]]:
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    kv = (cfg.get("num_key_value_heads") or heads) * head_dim
    inter = cfg["intermediate_size"]
    return {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
            "o_proj": (heads * head_dim, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}


def build_demo_lora(base: str, out: str, rank: int = 8, seed: int = 0,
                    targets: tuple[str, ...] = DEFAULT_TARGETS, alpha: float | None = None,
                    gain: float = 0.3) -> Path:
    """Write a random adapter for the checkpoint at ``base`` into ``out``; returns ``out``."""
    if rank < 1:
        raise ValueError(f"Parameter rank must be >= 1, got {rank}")
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        raise ValueError(f"Parameter targets must be among {list(TARGETS)}, got {unknown}")
    cfg = json.loads((Path(base) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    shapes = _module_shapes(cfg)
    alpha = float(2 * rank if alpha is None else alpha)
    scaling = alpha / rank
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(cfg["num_hidden_layers"]):
        for t in targets:
            d_in, d_out = shapes[t]
            parent = "self_attn" if t in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            key = f"base_model.model.model.layers.{layer}.{parent}.{t}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, d_in, generator=gen) / math.sqrt(d_in)
            b_std = gain / scaling / math.sqrt(rank)
            tensors[f"{key}.lora_B.weight"] = torch.randn(d_out, rank, generator=gen) * b_std
    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dest / WEIGHTS_FILE), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base),
        "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0, "target_modules": list(targets),
        "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
        "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {}, "inference_mode": True,
        "init_lora_weights": True, "layers_to_transform": None, "layers_pattern": None,
    }
    (dest / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return dest

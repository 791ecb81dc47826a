"""A GGUF's model config as our own dataclass, where transformers' config class would give the same fields.

transformers 5's model config classes import ``transformers.utils.type_validators``, which pulls in activations,
hub kernels, ``torch.distributed.tensor`` and sympy: ~60 MB resident that a GGUF serve never uses (issue 44: RSS after
load). The metadata is still read by transformers' own GGUF code (``load_gguf_checkpoint(return_tensors=False)``: its
key mapping, the tied head, the vocabulary size), and the config is built here with ``LlamaConfig``'s defaults for
the fields the model code reads (models/llama.py ``LlamaDims.from_hf``, models/rope.py, the EOS ids). Anything this
does not model (another model type, RoPE scaling, a key we do not know) goes through transformers as before."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

LIGHT_TYPES = ("llama",)  # general.architecture values built here (Mistral files are written as "llama" too)
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
_NOT_READ = ("_model_name_or_path", "unk_token_id")  # in the metadata, read by no model code


@dataclass
class GgufConfig:
    """The fields of ``LlamaConfig`` the model code reads, with its defaults."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_parameters: dict[str, Any]
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    pad_token_id: int | None = None
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"
    num_labels: int = 2  # PreTrainedConfig's default (id2label of two): what a scoring task would see


def light_config(raw: dict[str, Any]) -> GgufConfig | None:
    """``raw`` (transformers' GGUF config dict) as a GgufConfig, or None where transformers' class must build it."""
    known = {f.name for f in fields(GgufConfig)} | {"rope_theta", *_NOT_READ}
    if raw.get("model_type") not in LIGHT_TYPES or any(k not in raw for k in _REQUIRED) or set(raw) - known:
        return None  # rope_scaling among the unknown keys: its parameters are transformers' to standardise
    kw = {k: v for k, v in raw.items() if k not in ("rope_theta", *_NOT_READ)}
    heads = int(raw["num_attention_heads"])
    kw["num_key_value_heads"] = raw.get("num_key_value_heads") or heads
    kw["head_dim"] = raw.get("head_dim") or int(raw["hidden_size"]) // heads
    kw["rope_parameters"] = {"rope_theta": float(raw.get("rope_theta", 10000.0)), "rope_type": "default"}
    return GgufConfig(**kw)

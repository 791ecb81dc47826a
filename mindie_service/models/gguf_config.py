"""A GGUF's model config as our own dataclass, where transformers' config class would give the same fields.

transformers 5's model config classes import ``transformers.utils.type_validators``, which pulls in activations,
hub kernels, ``torch.distributed.tensor`` and sympy: ~60 MB resident that a GGUF serve never uses (issue 44: RSS after
load). A llama file's metadata is read here too (``raw_config``: what transformers' ``load_gguf_checkpoint(
return_tensors=False)`` gives for it, its key mapping, the tied head, the vocabulary size, without importing its GGUF
integration or parsing every field into Python), and the config is built with ``LlamaConfig``'s defaults for the
fields the model code reads (models/llama.py ``LlamaDims.from_hf``, models/rope.py, the EOS ids). Anything this
does not model (another model type, RoPE scaling, a key we do not know) goes through transformers as before."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

LIGHT_TYPES = ("llama",)  # general.architecture values built here (Mistral files are written as "llama" too)
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
_NOT_READ = ("_model_name_or_path", "unk_token_id")  # in the metadata, read by no model code
# transformers' GGUF_CONFIG_MAPPING for llama (integrations/ggml.py): llama.<key> -> config field
_LLAMA_KEYS = {"context_length": "max_position_embeddings", "block_count": "num_hidden_layers",
               "feed_forward_length": "intermediate_size", "embedding_length": "hidden_size",
               "rope.dimension_count": "head_dim", "rope.freq_base": "rope_theta",
               "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
               "attention.layer_norm_rms_epsilon": "rms_norm_eps", "vocab_size": "vocab_size"}
_TOKEN_IDS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id", "unknown_token_id": "unk_token_id",
              "padding_token_id": "pad_token_id"}  # its tokenizer.ggml.<key> -> config field
# key prefixes that mapping reads or leaves alone; a key under any other (another architecture's) goes to transformers
_PREFIXES = frozenset({"general", "llama", "tokenizer", "quantize", "split"})


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


def raw_config(reader: Any) -> dict[str, Any] | None:
    """What transformers' ``load_gguf_checkpoint(return_tensors=False)["config"]`` gives for a llama file parsed as
    ``reader`` (models/gguf_reader.py), or None for any other file (transformers reads it). A file named exactly
    "mistral" is one transformers reads as Mistral's."""
    def value(key: str) -> Any:
        f = reader.fields[key]
        got = f.contents()
        return got[0] if isinstance(got, list) and len(got) == 1 else got  # a one-item array reads as its item
    if "general.architecture" not in reader.fields or value("general.architecture") != "llama" or \
            ("general.name" in reader.fields and value("general.name") == "mistral") or \
            any(k.split(".")[0] not in _PREFIXES for k in reader.fields if not k.startswith("GGUF.")):
        return None
    raw: dict[str, Any] = {"tie_word_embeddings": all(t.name != "output.weight" for t in reader.tensors),
                           "model_type": "llama"}
    if "general.name" in reader.fields:
        raw["_model_name_or_path"] = value("general.name")
    for key, name in _LLAMA_KEYS.items():
        if f"llama.{key}" in reader.fields:
            raw[name] = value(f"llama.{key}")
    for key, name in _TOKEN_IDS.items():
        if f"tokenizer.ggml.{key}" in reader.fields:
            raw[name] = value(f"tokenizer.ggml.{key}")
    if "vocab_size" not in raw and "tokenizer.ggml.tokens" in reader.fields:
        raw["vocab_size"] = len(reader.fields["tokenizer.ggml.tokens"].data)
    return raw

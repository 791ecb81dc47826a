"""Will a model fit? Its weights (read from the safetensors headers, so quantized tensors count at their
stored size; a GGUF file's tensors at the size they take once loaded: a quantized linear or embedding weight whose
block type the CPU kernels run stays as stored in an fp32 load on one device (models/gguf_packed.py), every other
tensor is dequantized at load to the configured dtype) plus a minimum KV pool (one full-length sequence), against the
memory left now. Only headers are read, never the tensors."""
from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mindie_service.catalog.checkpoint_kind import GGUF, detect, the_gguf
from mindie_service.models.gguf_reader import read_gguf

logger = logging.getLogger(__name__)

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "F8_E4M3": 1, "F8_E5M2": 1, "BOOL": 1}
_FLOAT = {"F16", "BF16", "F32", "F64"}
MAX_HEADER = 100 << 20


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int  # bytes once loaded
    kv_min: int  # bytes of a KV pool holding one full-length sequence

    @property
    def total(self) -> int:
        return self.weights + self.kv_min


def _header(path: Path) -> dict[str, object]:
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER:
            raise ValueError(f"{path.name}: safetensors header of {n} bytes")
        return json.loads(f.read(n))


def weights_bytes(folder: Path, float_bytes: int) -> int:
    """Tensor bytes of every *.safetensors file; float tensors at ``float_bytes`` each (the engine's dtype:
    4 on CPU), integer (quantized) tensors at their stored width."""
    total = 0
    for f in sorted(folder.glob("*.safetensors")):
        for name, meta in _header(f).items():
            if name == "__metadata__" or not isinstance(meta, dict):
                continue
            n = 1
            for d in meta.get("shape", []):
                n *= int(d)
            dt = str(meta.get("dtype"))
            total += n * (float_bytes if dt in _FLOAT else _DTYPE_BYTES.get(dt, 4))
    return total


def kv_min_bytes(config: dict[str, object], max_seq_len: int, dtype_bytes: int) -> int:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    assert isinstance(text, dict)
    layers = int(text.get("num_hidden_layers", 0) or 0)
    heads = int(text.get("num_attention_heads", 1) or 1)
    kv_heads = int(text.get("num_key_value_heads", heads) or heads)
    head_dim = int(text.get("head_dim") or int(text.get("hidden_size", 0) or 0) // heads)
    return 2 * layers * kv_heads * head_dim * dtype_bytes * max_seq_len


def _loaded_bytes(t: Any, float_bytes: int, packed: bool) -> int:
    """A tensor's bytes once loaded: as stored where it stays packed, else ``float_bytes`` a value."""
    if packed and len(t.shape) == 2 and t.tensor_type.name not in ("F32", "F16", "BF16"):
        from npu_ops import gguf_cpu  # the kernels' table: only where packing may apply
        if gguf_cpu.runnable(t.tensor_type.name) is None:
            return int(t.n_bytes)
    return int(t.n_elements) * float_bytes


def gguf_estimate_parts(file: Path, max_seq_len: int, float_bytes: int, packed: bool = False) -> tuple[int, int]:
    """(weights, minimum KV pool) bytes of a GGUF file, from its header: every tensor at ``float_bytes`` per
    value (the loader dequantizes each ggml type to the model's dtype) or, with ``packed`` (an fp32 load on one
    device), a quantized 2-D tensor of a type the CPU kernels run at its stored size; the KV pool from its attention
    metadata."""
    reader = read_gguf(file)  # the load that follows reuses this parse

    def meta(key: str) -> Any:
        f = reader.fields.get(key)
        return f.contents() if f is not None else None
    arch = meta("general.architecture")
    weights = sum(_loaded_bytes(t, float_bytes, packed) for t in reader.tensors if t.name != "rope_freqs.weight")
    cfg = {"num_hidden_layers": meta(f"{arch}.block_count"),
           "num_attention_heads": meta(f"{arch}.attention.head_count"),
           "num_key_value_heads": meta(f"{arch}.attention.head_count_kv"),
           "head_dim": meta(f"{arch}.attention.key_length"), "hidden_size": meta(f"{arch}.embedding_length")}
    return weights, kv_min_bytes({k: v for k, v in cfg.items() if v is not None}, max_seq_len, float_bytes)


def estimate(folder: Path, max_seq_len: int, world_size: int = 1, float_bytes: int = 4) -> MemoryEstimate:
    """Per device: weights are split over ``world_size`` devices (tensor parallel), as is the KV pool.
    ValidationError (naming the file) for a GGUF file whose header cannot be read."""
    if detect(folder) == GGUF:
        w, kv = gguf_estimate_parts(the_gguf(folder), max_seq_len, float_bytes,
                                    packed=float_bytes == 4 and world_size <= 1)
    else:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        w = weights_bytes(folder, float_bytes)
        kv = kv_min_bytes(cfg, max_seq_len, float_bytes)
    ws = max(1, world_size)
    return MemoryEstimate(w // ws, kv // ws)


def loaded_estimate(folder: Path, cfg: Any, world_size: int = 1) -> int:
    """Bytes one instance of the model takes once loaded, per device, from its headers: the weights plus the KV pool
    as ``cfg`` (an EngineConfig) sizes it (``num_kv_blocks`` blocks, else at least one full-length sequence)."""
    fb = 2 if cfg.dtype in ("float16", "bfloat16") else 4
    est = estimate(folder, cfg.max_seq_len, world_size=world_size, float_bytes=fb)
    pool = est.kv_min
    if cfg.num_kv_blocks:  # kv_min is one max_seq_len sequence: per token, times the configured pool's tokens
        pool = est.kv_min * cfg.num_kv_blocks * cfg.cache_block_size // max(1, cfg.max_seq_len)
    return est.weights + pool

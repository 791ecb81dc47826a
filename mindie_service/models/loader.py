"""Read a Hugging Face checkpoint folder (config.json + *.safetensors) into our model."""
from __future__ import annotations

import gc
import importlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch
from safetensors import safe_open
from torch import nn
from transformers import AutoConfig

from mindie_service.models import gguf_checkpoint, gguf_packed, gguf_reader, packed_arena, quantize, w4a16_checkpoint
from mindie_service.models.demo_marker import demo_warning, gguf_beside_demo
from mindie_service.models.registry import family_for
from mindie_service.models.rope import rope_tables
from mindie_service.models.shard import Reduce, shard_model
from mindie_service.models.weights import tie_and_find_missing
from mindie_service.errors import check
from npu_ops import memory
from npu_ops.linear import pack_linears
from npu_ops.platform import default_dtype, staging_device

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class LoadedModel:
    model: nn.Module
    hf_config: Any
    architecture: str
    dtype: torch.dtype
    # Media encoders of a multimodal checkpoint (models/media_encoders.py), None for text-only models.
    encoder: Any = None
    # GGUF checkpoints: ggml tensor type -> what loading did to its tensors (the log and /info say it).
    weights_report: dict[str, str] = field(default_factory=dict)


def read_checkpoint_config(path: str | Path) -> dict[str, Any]:
    """The raw config.json, with MindIE's requirements checked (torch_dtype and vocab_size present)."""
    p = Path(path)
    check(p.is_dir(), "model", "an existing checkpoint folder", str(path))
    cfg_file = p / "config.json"
    check(cfg_file.is_file(), "model", "a folder holding config.json", str(path))
    try:
        raw = json.loads(cfg_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"Parameter model must hold a readable config.json, got {str(cfg_file)!r} ({exc})") from exc
    text_cfg = raw.get("text_config", raw)
    check("vocab_size" in text_cfg or "padded_vocab_size" in text_cfg, "model",
          "a checkpoint whose config.json holds vocab_size", str(cfg_file))
    check("torch_dtype" in raw or "dtype" in raw or "torch_dtype" in text_cfg, "model",
          "a checkpoint whose config.json holds torch_dtype", str(cfg_file))
    check(any(p.glob("*.safetensors")), "model", "a folder holding *.safetensors weights", str(path))
    return raw


def load_weights(model: nn.Module, path: Path, prefix_map: dict[str, str] | None = None) -> None:
    """Copy every tensor of a safetensors checkpoint folder into the model."""
    copy_tensors(model, _safetensors(path), str(path), prefix_map)


def _safetensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def copy_tensors(model: nn.Module, tensors: Iterable[tuple[str, Any]], source: str,
                 prefix_map: dict[str, str] | None = None) -> dict[str, dict[int, Any]]:
    """Copy (checkpoint name, tensor) pairs into the model, packing q/k/v and gate/up (nano-vllm style); a
    tied LM head then shares the embeddings. Raises naming ``source`` when a weight is left unloaded. A value that
    is not a tensor (a GGUF weight kept packed) is not copied: it is returned as {module name: {shard: value}}
    for models/gguf_packed.py to install."""
    params = dict(model.named_parameters())
    packed: dict[str, tuple[str, int]] = getattr(model, "PACKED", {})
    loaded: set[str] = set()
    kept: dict[str, dict[int, Any]] = {}
    for name, tensor in tensors:
        target = name
        for old, new in (prefix_map or {"model.": ""}).items():
            if target.startswith(old):
                target = new + target[len(old):]
                break
        sub = next((k for k in packed if f".{k}." in target), None)
        if sub is not None:
            pname, shard = packed[sub]
            target = target.replace(f".{sub}.", f".{pname}.")
            if target not in params:
                continue
            if not isinstance(tensor, torch.Tensor):
                kept.setdefault(target.rpartition(".")[0], {})[shard] = tensor
                loaded.add(f"{target}#{shard}")
                continue
            sizes = model.shard_sizes(pname)  # type: ignore[operator]
            off = sum(sizes[:shard])
            params[target].data[off:off + sizes[shard]].copy_(tensor)
            loaded.add(f"{target}#{shard}")
        elif target in params and not isinstance(tensor, torch.Tensor):
            kept.setdefault(target.rpartition(".")[0], {})[0] = tensor
            loaded.add(target)
        elif target in params:
            check(params[target].shape == tensor.shape, "model",
                  f"a tensor {target} of shape {tuple(params[target].shape)}", tuple(tensor.shape))
            params[target].data.copy_(tensor)
            loaded.add(target)
    missing = tie_and_find_missing(model, params, loaded, tie="embed_tokens" not in kept)
    if missing:
        raise ValueError(f"Parameter model must hold every weight; checkpoint {source} lacks {missing[:5]}")
    return kept


@dataclass
class _Checkpoint:
    """What load_model needs of a checkpoint before it builds the model."""
    hf_config: Any
    architectures: list[str]
    dtype: str  # the checkpoint's own dtype, for dtype "auto"
    gguf: gguf_checkpoint.GgufCheckpoint | None = None


def checkpoint_config(path: str | Path) -> tuple[Any, str]:
    """A checkpoint's (text) model config and its own dtype, without loading its weights (a Hugging Face
    folder or a GGUF file)."""
    ckpt = _open(Path(path))
    return getattr(ckpt.hf_config, "text_config", None) or ckpt.hf_config, ckpt.dtype


def _open(p: Path) -> _Checkpoint:
    file = gguf_checkpoint.find_gguf(p)
    if file is not None:
        g = gguf_checkpoint.open_checkpoint(file)
        return _Checkpoint(g.hf_config, [g.architecture], "float32", g)
    raw = read_checkpoint_config(p)
    return _Checkpoint(AutoConfig.from_pretrained(str(p)), raw.get("architectures") or [],
                       str(raw.get("torch_dtype") or raw.get("dtype") or "float32"))


def _load_gguf(model: nn.Module, g: gguf_checkpoint.GgufCheckpoint, quantization: str | None,
               keep: bool) -> dict[str, str]:
    """A GGUF's tensors into the model, its quantized weights kept packed with ``keep``; returns the report."""
    kept = copy_tensors(model, g.tensors(quantization, packed=keep), str(g.path))
    gguf_packed.install(model, kept)
    for kind, what in g.report.items():  # per type; the per-tensor lines only at DEBUG (hundreds of them)
        logger.log(logging.INFO if "." not in kind else logging.DEBUG, "%s: %s %s", g.path.name, kind, what)
    return g.report


def _load_w4a16(model: nn.Module, p: Path, fmt: w4a16_checkpoint.W4Format, keep: bool, blocks: bool,
                prefix_map: dict[str, str]) -> dict[str, str]:
    """A W4A16 checkpoint's tensors into the model, its int4 weights kept with ``keep`` (as CPU blocks with
    ``blocks``, else for a device's int4 matmul); returns the report."""
    report: dict[str, str] = {}
    kept = copy_tensors(model, w4a16_checkpoint.tensors(p, fmt, keep, report, blocks), str(p), prefix_map)
    quantize.install_int4(model, kept, blocks)
    logger.info("%s: %s %s", p.name, fmt.name, report.get("W4A16", "no quantized tensors"))
    return report


def _fill(model: nn.Module, p: Path, ckpt: _Checkpoint, prefix_map: dict[str, str], device: torch.device,
          torch_dtype: torch.dtype, quantization: str | None, shard: Any, packed: bool) -> tuple[bool, dict[str, str]]:
    """The checkpoint's weights into the model; returns (already quantized, the weights report)."""
    if ckpt.gguf is not None:
        keep = gguf_packed.keep_packed(ckpt.gguf.path, device, torch_dtype, quantization, shard, packed)
        return False, _load_gguf(model, ckpt.gguf, quantization, keep)
    if (w4 := w4a16_checkpoint.detect(p)) is not None:  # int4 stays int4 unless another scheme is asked for
        own = quantization in (None, "w4a16")
        on_device = own and packed and shard is None and device.type in ("cuda", "npu")
        keep = on_device or gguf_packed.keep_packed(p, device, torch_dtype, None if own else quantization, shard,
                                                    packed)
        return own, _load_w4a16(model, p, w4, keep, not on_device, prefix_map)
    if quantize.load_prequantized(model, p, prefix_map):
        return True, {}
    load_weights(model, p, prefix_map)
    return False, {}


def _pack(model: nn.Module, batch_hint: int, torch_dtype: torch.dtype,
          gguf: gguf_checkpoint.GgufCheckpoint | None) -> None:
    """The loaded weights packed for the CPU kernels, in one huge-page arena."""
    pack_linears(model, batch_hint)
    quantize.pack_quantized(model, torch_dtype)
    packed_arena.gather_packed(model)
    if gguf is not None:
        gguf_reader.release_pages(gguf.path)  # its packed weights were copied into the arena


def release_checkpoint(path: str | Path) -> None:
    """After a model and its tokenizer are loaded: a GGUF's cached parse dropped (models/gguf_reader.forget), the
    garbage collected and the C heap's free pages given back (glibc's malloc_trim), so what loading allocated and
    freed does not stay in the RSS (issue 44)."""
    if gguf_checkpoint.find_gguf(path) is not None:
        gguf_reader.forget()
    gc.collect()
    memory.trim_heap()


def to_empty(model: nn.Module, device: torch.device) -> nn.Module:
    """``model.to_empty(device)`` with ``torch.empty`` of each shape: ``empty_like`` of a meta tensor runs through
    torch._refs, which imports torch.fx's symbolic shapes and sympy (~30 MB resident a serve never uses)."""
    return model._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))


def load_model(path: str | Path, dtype: str, device: torch.device, max_positions: int,
               batch_hint: int = 32, quantization: str | None = None, kv_cache_dtype: str = "auto",
               shard: tuple[int, int, Reduce] | None = None, quantize_lm_head: bool = False,
               gguf_packed_weights: bool = True, gguf_activations: str = "int8") -> LoadedModel:
    """``path``: a Hugging Face folder (config.json + *.safetensors, or msModelSlim's layout), a ``.gguf`` file
    or a folder holding one (models/gguf_checkpoint.py).
    ``batch_hint``: the decode batch size CPU weight packing is tuned for (npu_ops.linear).
    ``quantization`` (w8a16 | w8a8) quantizes the linears after loading (models/quantize.py), unless the
    checkpoint is already quantized by msModelSlim (``quantize_lm_head``: the output projection too); ``kv_cache_dtype`` is kept on the model for the runner.
    ``shard`` (rank, world size, all-reduce): keep one tensor-parallel rank's shard (models/shard.py), after
    quantizing (scales shard with their weights) and before packing.
    ``gguf_packed_weights``: a GGUF's quantized weights stay as stored where the CPU kernels run them
    (models/gguf_packed.py), a W4A16 checkpoint's int4 weights (models/w4a16_checkpoint.py) likewise; False
    dequantizes them all (the fp32 reference the accuracy tests compare with). ``gguf_activations`` (a GGUF's
    packed linears; ModelConfig.ggufActivations): "int8" quantizes x per block in decode steps, "int8-all" in
    prefill pieces too, "fp32" never (models/gguf_packed.set_activations)."""
    p = Path(path)
    ckpt = _open(p)
    if ckpt.gguf is None and (demo := demo_warning(p)) is not None:
        logger.warning("%s", demo)  # random weights: say so wherever the model is loaded (server, LLM, catalog)
    elif ckpt.gguf is not None and gguf_beside_demo(p):
        logger.warning("%s: reading %s; the demo model's files beside it (devkit.json, config.json, ...) are "
                       "ignored and may be deleted", p, ckpt.gguf.path.name)
    hf_cfg = ckpt.hf_config
    arch, family = family_for(ckpt.architectures)
    if dtype == "auto":
        dtype = default_dtype(device, ckpt.dtype)
    torch_dtype = DTYPES[dtype]
    text_cfg = getattr(hf_cfg, family.text_config) if family.text_config else hf_cfg
    max_pos = min(max_positions, getattr(text_cfg, "max_position_embeddings", max_positions) or max_positions)
    cos, sin = rope_tables(family.rotary_class, text_cfg, max_pos)
    with torch.device("meta"):
        model = family.build(text_cfg, cos, sin)
    model = to_empty(model, staging_device(device))
    model.rope_cos, model.rope_sin = cos, sin
    prequantized, report = _fill(model, p, ckpt, dict(family.weight_prefixes), device, torch_dtype, quantization,
                                 shard, gguf_packed_weights)
    if ckpt.gguf is not None:
        report = {**report, **gguf_packed.set_activations(model, gguf_activations)}
    model = model.to(device=device, dtype=torch_dtype).eval()
    if quantization and not prequantized:
        quantize.quantize_loaded(model, quantization, quantize_lm_head)
        report = {**report, **(quantize.int4_report(model) if quantization == "w4a16" else {})}
    if shard is not None:
        shard_model(model, *shard)
    model.kv_cache_dtype = kv_cache_dtype
    model.weights_report = report  # also on the model: what an engine holding only the model can show
    model.rope_cos, model.rope_sin = cos.to(device, torch_dtype), sin.to(device, torch_dtype)
    n_params = sum(t.numel() for t in model.parameters()) + gguf_packed.packed_values(model)
    _pack(model, batch_hint, torch_dtype, ckpt.gguf)  # after counting: packing frees the dense weights
    rss = memory.rss_mib()
    logger.info("loaded %s (%s, %.1fM parameters, %s) on %s; process RSS %s MiB", p.name, arch, n_params / 1e6, dtype,
                device, "?" if rss is None else rss)
    encoder = None
    if family.encoder:
        mod_name, cls_name = family.encoder.split(":")
        encoder = getattr(importlib.import_module(mod_name), cls_name).load(p, hf_cfg, device, torch_dtype)
    return LoadedModel(model, hf_cfg, arch, torch_dtype, encoder, report)

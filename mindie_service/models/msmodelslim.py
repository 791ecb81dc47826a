"""msModelSlim's quantized checkpoint layout, read and written.

A folder holds ``quant_model_weight*.safetensors`` and ``quant_model_description*.json``: the JSON maps
every tensor name to its type (``FLOAT``, ``W8A16``, ``W8A8``, ``W8A8_DYNAMIC``; ``model_quant_type``
names the whole). Per quantized linear ``<module>``:
- W8A16: ``weight`` int8 [n, k], ``weight_scale`` and ``weight_offset`` fp32 [n] (or [n, 1]);
  ``deq_weight = (weight - weight_offset) * weight_scale``.
- W8A8 (static): ``weight`` int8, ``input_scale`` / ``input_offset`` [1], ``deq_scale`` [n] (fp32, or
  int64 holding the fp32 bits), ``quant_bias`` int32 [n]:
  ``xq = x / input_scale + input_offset``, ``y = (xq . weight^T + quant_bias) * deq_scale``.
- W8A8_DYNAMIC: ``weight`` int8 with ``weight_scale`` / ``weight_offset`` as W8A16; activations
  quantized per token at run time.
q/k/v and gate/up are packed into one module here: their shards must share a type (and, for static
W8A8, the input scale and offset, which calibrating on the same input gives them).
``write_quantized`` (the ``quantize`` command) writes W8A8_DYNAMIC or W8A16 from a float checkpoint,
tensor by tensor."""
from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from mindie_service.models import gguf_checkpoint
from mindie_service.models.weights import tie_and_find_missing
from npu_ops import quant
from npu_ops.quant import QuantLinear

logger = logging.getLogger(__name__)

TYPES = {"W8A16": "w8a16", "W8A8_DYNAMIC": "w8a8", "W8A8": "w8a8_static"}
PARTS = ("weight", "weight_scale", "weight_offset", "input_scale", "input_offset", "deq_scale", "quant_bias", "bias")
SCHEME_TYPES = {"w8a8": "W8A8_DYNAMIC", "w8a16": "W8A16"}


def find_description(path: Path) -> Path | None:
    files = sorted(path.glob("quant_model_description*.json"))
    return files[0] if files else None


def _fail(what: str) -> ValueError:
    return ValueError(f"Parameter model must be a valid msModelSlim checkpoint: {what}")


def _map(name: str, prefix_map: dict[str, str]) -> str:
    for old, new in (prefix_map or {"model.": ""}).items():
        if name.startswith(old):
            return new + name[len(old):]
    return name


def _deq_scale(t: torch.Tensor) -> torch.Tensor:
    """int64 deq_scale holds the fp32 bits in its low 32 bits (Ascend's quant matmul takes it so)."""
    if t.dtype == torch.int64:
        return (t & 0xFFFFFFFF).to(torch.int32).view(torch.float32)
    return t.float()


def load(model: nn.Module, path: Path, desc_file: Path, prefix_map: dict[str, str]) -> None:
    """Fill ``model`` (on the staging device, float parameters allocated) from an msModelSlim folder: each
    quantized linear becomes a QuantLinear filled shard by shard; everything else loads as usual."""
    desc: dict[str, str] = json.loads(desc_file.read_text())
    if desc.get("kv_cache_type"):
        raise _fail(f"static KV-cache quantization ({desc['kv_cache_type']}) is not supported; "
                    "leave it out and set kvCacheDtype: int8 (dynamic per-token scales)")
    packed: dict[str, tuple[str, int]] = getattr(model, "PACKED", {})
    # our module name -> (scheme, {part: [(shard, tensor)]})
    qmods: dict[str, tuple[str, dict[str, list[tuple[int, torch.Tensor]]]]] = {}
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                kind = desc.get(name, "FLOAT")
                target, shard = _map(name, prefix_map), 0
                sub = next((k for k in packed if f".{k}." in target), None)
                if sub is not None:
                    target, shard = target.replace(f".{sub}.", f".{packed[sub][0]}."), packed[sub][1]
                module, _, part = target.rpartition(".")
                if kind != "FLOAT":
                    if kind not in TYPES:
                        raise _fail(f"{name} has type {kind!r}; supported: FLOAT, {', '.join(TYPES)}")
                    if part not in PARTS:
                        raise _fail(f"{name}: unknown quantization parameter {part!r}")
                    scheme, parts = qmods.setdefault(module, (TYPES[kind], {}))
                    if scheme != TYPES[kind]:
                        raise _fail(f"the shards packed into {module} mix {scheme} and {TYPES[kind]}")
                    parts.setdefault(part, []).append((shard, f.get_tensor(name)))
                    continue
                if target not in params:
                    continue
                tensor = f.get_tensor(name)
                if sub is not None:
                    sizes = model.shard_sizes(packed[sub][0])  # type: ignore[operator]
                    off = sum(sizes[:shard])
                    params[target].data[off:off + sizes[shard]].copy_(tensor)
                    loaded.add(f"{target}#{shard}")
                else:
                    if params[target].shape != tensor.shape:
                        raise _fail(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(params[target].shape)}")
                    params[target].data.copy_(tensor)
                    loaded.add(target)
    for module, (scheme, parts) in qmods.items():
        quant.swap_module(model, module, _build(model, module, scheme, parts))
        loaded.update(n for n in params if n.startswith(module + "."))
    missing = tie_and_find_missing(model, params, loaded)
    if missing:
        raise _fail(f"{path} lacks {missing[:5]}")
    logger.info("loaded msModelSlim checkpoint %s (%s; %d quantized linears)", path.name,
                desc.get("model_quant_type", "?"), len(qmods))


def _cat(parts: dict[str, list[tuple[int, torch.Tensor]]], part: str, flat: bool = True) -> torch.Tensor | None:
    items = sorted(parts.get(part, []), key=lambda st: st[0])
    if not items:
        return None
    ts = [t.reshape(-1) if flat else t for _, t in items]
    return torch.cat(ts)


def _build(model: nn.Module, module: str, scheme: str, parts: dict[str, list[tuple[int, torch.Tensor]]]) -> QuantLinear:
    old = model.get_submodule(module)
    if not isinstance(old, nn.Linear):
        raise _fail(f"{module} is quantized but is not a linear layer here")
    n_shards = len(model.shard_sizes(module.rpartition(".")[2])) if module.endswith(("qkv_proj", "gate_up_proj")) else 1
    for need in ("weight",) + (("weight_scale",) if scheme != "w8a8_static" else
                               ("input_scale", "input_offset", "deq_scale", "quant_bias")):
        if len(parts.get(need, [])) != n_shards:
            raise _fail(f"{module} lacks {need} (msModelSlim {scheme}: needs it for every packed shard)")
    weight = _cat(parts, "weight", flat=False)
    if weight.dtype != torch.int8 or tuple(weight.shape) != (old.out_features, old.in_features):
        raise _fail(f"{module}.weight must be int8 of shape {(old.out_features, old.in_features)}, "
                    f"got {weight.dtype} {tuple(weight.shape)}")
    bias = _cat(parts, "bias")
    if bias is None and old.bias is not None:  # a FLOAT bias beside quantized weights: loaded into the old module
        bias = old.bias.detach().clone()
    if scheme == "w8a8_static":
        scales = [t.reshape(-1) for _, t in sorted(parts["input_scale"])]
        offsets = [t.reshape(-1) for _, t in sorted(parts["input_offset"])]
        if any(not torch.equal(s, scales[0]) for s in scales) or any(not torch.equal(o, offsets[0]) for o in offsets):
            raise _fail(f"the shards packed into {module} have different input_scale/input_offset")
        static = {"input_scale": scales[0].float(), "input_offset": offsets[0].float(),
                  "deq_scale": torch.cat([_deq_scale(t.reshape(-1)) for _, t in sorted(parts["deq_scale"])]),
                  "quant_bias": _cat(parts, "quant_bias").to(torch.int32)}
        return QuantLinear(old.in_features, old.out_features, scheme, weight, torch.ones(old.out_features), bias,
                           static=static)
    scale = _cat(parts, "weight_scale").float()
    offset = _cat(parts, "weight_offset")
    if offset is not None and offset.abs().max() > 0:
        # asymmetric weights: fold the offset into the int8 values where they still fit in [-127, 127]
        shifted = weight.to(torch.int16) - offset.round().to(torch.int16)[:, None]
        if shifted.abs().max() > 127:
            raise _fail(f"{module}: weight - weight_offset leaves the int8 range; only symmetric weights load")
        weight = shifted.to(torch.int8)
    return QuantLinear(old.in_features, old.out_features, scheme, weight, scale, bias)


# ---------------------------------------------------------------- writing (the quantize command)
COPY_GLOBS = ("*.json", "*.txt", "*.model", "*.tiktoken", "*.py", "*.jinja")


def _is_quantizable(name: str, tensor: torch.Tensor) -> bool:
    """Decoder-layer projections: 2-D float weights named *_proj.weight inside layers (embeddings, norms
    and the output head stay FLOAT, as msModelSlim leaves them by default)."""
    return (tensor.dim() == 2 and tensor.is_floating_point() and name.endswith("_proj.weight")
            and ".layers." in name and "lm_head" not in name)


def write_quantized(src: str | Path, dst: str | Path, scheme: str) -> Path:
    """Quantize a float checkpoint folder into msModelSlim's layout (``W8A8_DYNAMIC`` for w8a8, ``W8A16``
    for w8a16), one tensor at a time; tokenizer and config files are copied, config.json gains
    ``quantize``. ``src`` may be a .gguf file (or a folder holding one): it is dequantized to fp32 first. Returns the output folder."""
    if scheme not in SCHEME_TYPES:
        raise ValueError(f"scheme must be one of {sorted(SCHEME_TYPES)}, got {scheme!r}")
    src, dst = Path(src), Path(dst)
    if gguf_checkpoint.find_gguf(src) is not None:  # a .gguf: its fp32 folder first, then as any folder
        with tempfile.TemporaryDirectory(prefix="gguf-") as tmp:
            return write_quantized(gguf_checkpoint.export_folder(src, tmp), dst, scheme)
    if not (src / "config.json").is_file() or not any(src.glob("*.safetensors")):
        raise ValueError(f"--in must be a checkpoint folder with config.json and *.safetensors (or a .gguf file), got {str(src)!r}")
    if find_description(src) is not None:
        raise ValueError(f"{src} is already quantized (it holds a quant_model_description file)")
    dst.mkdir(parents=True, exist_ok=True)
    kind = SCHEME_TYPES[scheme]
    desc: dict[str, str] = {"model_quant_type": kind}
    out: dict[str, torch.Tensor] = {}
    for file in sorted(src.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                if not _is_quantizable(name, t):
                    out[name], desc[name] = t.contiguous(), "FLOAT"
                    continue
                q, s = quant.quantize_weight(t)
                base = name[:-len("weight")]
                shape = (-1, 1) if kind == "W8A8_DYNAMIC" else (-1,)  # as msModelSlim writes each
                out[name] = q
                out[base + "weight_scale"] = s.reshape(shape).contiguous()
                out[base + "weight_offset"] = torch.zeros_like(s).reshape(shape).contiguous()
                for part in ("weight", "weight_scale", "weight_offset"):
                    desc[base + part] = kind
                del t
    tag = kind.lower()
    save_file(out, str(dst / f"quant_model_weight_{tag}.safetensors"), metadata={"format": "pt"})
    for pattern in COPY_GLOBS:
        for p in src.glob(pattern):
            if p.name not in ("config.json",) and not p.name.startswith("quant_model_description"):
                shutil.copy2(p, dst / p.name)
    cfg: dict[str, Any] = json.loads((src / "config.json").read_text())
    cfg["quantize"] = tag
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    (dst / f"quant_model_description_{tag}.json").write_text(json.dumps(desc, indent=2))
    logger.info("wrote %s checkpoint %s", kind, dst)
    return dst

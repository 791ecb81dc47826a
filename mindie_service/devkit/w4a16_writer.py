"""W4A16 test checkpoints from a float one (models/w4a16_checkpoint.py reads them): every decoder linear rounded to
int4 (npu_ops.quant_w4a16.quantize_rtn) and written in one of the three layouts, per their documented formats;
beside it, the same weights dequantized to float (``reference``), the checkpoint transformers runs to check ours.

``write(src, out, fmt, group_size, symmetric, scale_dtype)``: ``fmt`` is ``compressed-tensors``, ``awq``,
``msmodelslim`` (msModelSlim's ascendV1 layout, packed) or ``msmodelslim-mindie`` (its MindIE layout, one value a
byte); ``group_size`` None is channel-wise (one group a row; compressed-tensors and msModelSlim only)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from npu_ops.quant_w4a16 import Int4Weight, pack_low_first, quantize_rtn

FORMATS = ("compressed-tensors", "awq", "msmodelslim", "msmodelslim-mindie")
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's WQLinear_GEMM: nibble i of a word holds column 8 c + AWQ_ORDER[i]


def _words_low_first(q: torch.Tensor) -> torch.Tensor:
    """uint8 [r, c] (0..15) -> int32 [r, c / 8]: value i at bits 4 (i mod 8) of word i / 8 (compressed-tensors)."""
    return pack_low_first(q).reshape(-1).view(torch.int32).reshape(q.shape[0], -1)


def _awq_words(q: torch.Tensor) -> torch.Tensor:
    """uint8 [r, c] -> int32 [r, c / 8] in AutoAWQ's order."""
    r, c = q.shape
    cols = q.to(torch.int32).reshape(r, c // 8, 8)
    out = torch.zeros(r, c // 8, dtype=torch.int32)
    for i, src in enumerate(AWQ_ORDER):
        out |= cols[..., src] << (4 * i)
    return out


def encode(w: Int4Weight, fmt: str, scale_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One linear's tensors in ``fmt`` (names relative to its module)."""
    n, k = w.shape
    zero = None if w.zero is None else w.zero.to(torch.uint8)
    if fmt == "compressed-tensors":
        out = {"weight_packed": _words_low_first(w.q), "weight_scale": w.scale.to(scale_dtype),
               "weight_shape": torch.tensor([n, k])}
        if zero is not None:  # packed down the rows, [ceil(n / 8), groups]
            zt = torch.nn.functional.pad(zero.T.contiguous(), (0, -n % 8))
            out["weight_zero_point"] = _words_low_first(zt).T.contiguous()
        return out
    if fmt == "awq":
        z = zero if zero is not None else torch.full_like(w.scale, 8, dtype=torch.uint8)
        return {"qweight": _awq_words(w.q.T.contiguous()), "qzeros": _awq_words(z.T.contiguous()),
                "scales": w.scale.T.contiguous().to(scale_dtype)}
    if fmt in ("msmodelslim", "msmodelslim-mindie"):  # msModelSlim's saver (models/w4a16_checkpoint.py cites it)
        signed = w.q ^ 0x08  # the signed value's two's-complement nibble
        if fmt == "msmodelslim-mindie":  # MindIE's safe_tensor layout: one signed value a byte
            weight = w.q.to(torch.int8) - 8
        elif w.scale.shape[1] == 1:  # ascendV1 per channel: pairs along the row
            weight = pack_low_first(signed).view(torch.int8)
        else:  # ascendV1 per group: pairs down the column, row 2i in the low nibble
            weight = pack_low_first(signed.T.contiguous()).T.contiguous().view(torch.int8)
        out = {"weight": weight, "weight_scale": w.scale.float()}
        # value = (weight - offset) * scale: offset = zero - 8 in the signed domain
        out["weight_offset"] = torch.zeros_like(out["weight_scale"]) if zero is None else zero.float() - 8
        return out
    raise ValueError(f"W4A16 format must be one of {FORMATS}, got {fmt!r}")


def _config(fmt: str, group_size: int | None, symmetric: bool) -> dict:
    if fmt == "compressed-tensors":
        weights = {"num_bits": 4, "type": "int", "symmetric": symmetric, "dynamic": False,
                   "strategy": "channel" if group_size is None else "group", "group_size": group_size}
        return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                              "format": "pack-quantized"}}, "ignore": ["lm_head"]}
    return {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm"}


def _read(src: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(src.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            out.update({name: f.get_tensor(name) for name in f.keys()})
    return out


def _copy_side_files(src: Path, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "devkit.json"):
            shutil.copy(f, out / f.name)
    return json.loads((src / "config.json").read_text())


def write(src: Path, out: Path, fmt: str, group_size: int | None = 128, symmetric: bool = True,
          scale_dtype: torch.dtype = torch.float16) -> Path:
    """``src``'s decoder linears in W4A16 as ``fmt`` at ``out``; returns ``out``. ``reference(out_ref)`` after it
    writes the same weights dequantized."""
    if fmt == "awq" and (group_size is None or symmetric):
        raise ValueError("AutoAWQ gemm checkpoints are grouped and asymmetric")
    cfg = _copy_side_files(src, out)
    tensors, desc, deq = {}, {}, {}
    for name, t in _read(src).items():
        mod = name.rpartition(".")[0]
        if name.endswith(".weight") and mod.rpartition(".")[2] in LINEARS:
            w = quantize_rtn(t.float(), group_size or t.shape[1], symmetric, scale_dtype)
            deq[name] = w.dequantize()
            tensors.update({f"{mod}.{part}": v for part, v in encode(w, fmt, scale_dtype).items()})
            desc.update({f"{mod}.{part}": "W4A16" for part in ("weight", "weight_scale", "weight_offset")})
        else:
            tensors[name], desc[name] = t, "FLOAT"
            deq[name] = t
    if fmt.startswith("msmodelslim"):  # ascendV1's description carries a version and the group size
        head = {"model_quant_type": "W4A16"} | ({} if fmt == "msmodelslim-mindie" else {"version": "1.0.0"}) | (
            {"group_size": group_size} if group_size and fmt == "msmodelslim" else {})
        (out / "quant_model_description_w4a16.json").write_text(json.dumps({**head, **desc}))
        save_file(tensors, str(out / "quant_model_weight_w4a16.safetensors"))
    else:
        cfg["quantization_config"] = _config(fmt, group_size, symmetric)
        save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    torch.save(deq, out / "dequantized.pt")  # what ``reference`` writes out
    return out


def reference(w4_dir: Path, out: Path) -> Path:
    """The float checkpoint of the weights ``write`` put in ``w4_dir``, dequantized exactly (transformers runs it)."""
    cfg = _copy_side_files(w4_dir, out)
    cfg.pop("quantization_config", None)
    for f in out.glob("quant_model_description*.json"):
        f.unlink()
    (out / "dequantized.pt").unlink(missing_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(torch.load(w4_dir / "dequantized.pt"), str(out / "model.safetensors"))
    return out

"""W4A16 checkpoints read into ``npu_ops.quant_w4a16.Int4Weight`` (issue 44), three layouts:

- ``compressed-tensors`` (llm-compressor's AWQ / GPTQ output; config.json ``quantization_config`` with
  ``quant_method: compressed-tensors`` and format ``pack-quantized``, 4-bit int weights, strategy ``group`` or
  ``channel``, symmetric or not, no activation quantization): per linear ``weight_packed`` int32 [n, k / 8] (value
  i of a row at bits 4 (i mod 8) of word i / 8, stored as q + 8), ``weight_scale`` [n, groups], ``weight_shape``
  [2], and when asymmetric ``weight_zero_point`` int32 [ceil(n / 8), groups] packed the same way down the rows;
  value = (q - zero_point) * scale. Activation-ordered groups (``weight_g_idx``) are refused.
- AutoAWQ ``gemm`` (``quant_method: awq``, ``version: gemm``): ``qweight`` int32 [k, n / 8], ``qzeros`` int32
  [groups, n / 8], ``scales`` fp16 [groups, n]; word nibble i (bits 4 i) holds column 8 c + (0, 2, 4, 6, 1, 3, 5,
  7)[i]; value = (q - zero) * scale with q, zero in 0..15.
- msModelSlim W4A16 (``quant_model_description*.json`` naming tensors ``W4A16``): ``weight_scale`` fp32 [n] / [n, 1]
  (per channel) or [n, groups]; ``weight_offset`` of the same shape (optional; zeros when symmetric); value =
  (weight - weight_offset) * weight_scale with ``weight`` the signed int4 value, as msModelSlim's own W4A16 fake
  quantizer computes it (msmodelslim/pytorch/llm_ptq/llm_ptq_tools/calibrator/calibrator_classes/fake_quantize/
  w8a16_w4a16_fakequantizer.py, lines 62 and 65: ``deq_weight = (quant_weight - weight_offset) * weight_scale``;
  docs/zh/user_guide/feature_guide/traditional_quantization_v0/quantized_weight_format.md, line 109: the NPU op
  computes (weight + offset) * scale, so Ascend's frameworks negate the offset at load). ``weight`` is int8 in one
  of the two layouts msModelSlim's saver writes (llm_ptq_tools/save/complex_quantifier.py, ``_w4a16_pack_int4``):
  MindIE's ``safe_tensor`` (a description without ``version``): [n, k], one signed value a byte, unpacked;
  ``ascendV1`` (the description has ``version``): two signed nibbles a byte, the first in the low nibble, paired
  along the row per channel ([n, k / 2]) and down the column per group ([n / 2, k]: rows 2i and 2i + 1).

``tensors`` yields the checkpoint's (name, tensor) pairs with each quantized linear as one ``<module>.weight``
whose value is an Int4Weight (``keep``) or its dequantized fp32 tensor; models/loader.py installs the kept ones."""
from __future__ import annotations

import functools
import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from safetensors import safe_open

from mindie_service.models import msmodelslim
from npu_ops.quant_w4a16 import Int4Weight, block_kind, blocks_unfit, nibbles_low_first

logger = logging.getLogger(__name__)

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the column each nibble of an AWQ word holds (offset in its 8)
AWQ_UNDO = (0, 4, 1, 5, 2, 6, 3, 7)  # the nibble each column offset is in


def _fail(path: Path, what: str) -> ValueError:
    return ValueError(f"Parameter model must be a W4A16 checkpoint we can read: {path}: {what}")


@dataclass
class W4Format:
    """A W4A16 layout found in a checkpoint folder: its name, the tensor suffix that marks a quantized linear,
    the parts each takes and the reader that makes its Int4Weight from them."""
    name: str
    marker: str
    parts: tuple[str, ...]
    read: Callable[[dict[str, torch.Tensor]], Int4Weight]
    described: set[str] = field(default_factory=set)  # msModelSlim: the W4A16 weights by name

    def is_quantized(self, name: str) -> bool:
        if self.described:
            return name in self.described
        return name.endswith("." + self.marker)


# ---------------------------------------------------------------- the three readers
def _group(k: int, groups: int, declared: int | None = None) -> int:
    """Columns a group: the checkpoint's declared group size, whose last group of a row may be shorter (SmolLM2's
    576 columns are 5 groups of 128), or without one the columns split evenly."""
    if declared and groups > 1:
        if groups != -(-k // declared):
            raise ValueError(f"{groups} groups of scales do not cover {k} columns in groups of {declared}")
        return declared
    if groups <= 0 or k % groups:
        raise ValueError(f"{groups} groups of scales do not split {k} columns evenly")
    return k // groups


def read_compressed_tensors(p: dict[str, torch.Tensor], group: int | None = None) -> Int4Weight:
    n, k = (int(v) for v in p["weight_shape"].tolist())
    q = nibbles_low_first(p["weight_packed"], k)  # stored as q + 8: already 0..15
    scale = p["weight_scale"].float().reshape(n, -1)
    zero = None
    zp = p.get("weight_zero_point")
    if zp is not None and zp.dtype == torch.int32:  # packed down the rows: [ceil(n / 8), groups], stored zp + 8
        zero = nibbles_low_first(zp.T.contiguous(), n).T.float()
    elif zp is not None:  # some writers keep them unpacked, signed: [n, groups]
        zero = zp.float().reshape(n, -1) + 8
    if zero is not None and bool((zero == 8).all()):  # symmetric after all: Q4_0 blocks, not Q4_1
        zero = None
    return Int4Weight(q, scale, zero, _group(k, scale.shape[1], group))


def _awq_unpack(words: torch.Tensor) -> torch.Tensor:
    """int32 [r, c / 8] in AWQ's nibble order -> uint8 [r, c]."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    nib = (words.to(torch.int32).unsqueeze(-1) >> shifts) & 0x0F  # [r, c / 8, 8], nibble i
    return nib[..., list(AWQ_UNDO)].reshape(words.shape[0], -1).to(torch.uint8)


def read_awq(p: dict[str, torch.Tensor], group: int | None = None) -> Int4Weight:
    q = _awq_unpack(p["qweight"]).T.contiguous()  # [n, k]
    zero = _awq_unpack(p["qzeros"]).T.float()
    scale = p["scales"].float().T
    return Int4Weight(q, scale, zero, _group(q.shape[1], scale.shape[1], group))


def _msmodelslim_values(w: torch.Tensor, n: int, per_group: bool, packed: bool) -> torch.Tensor:
    """msModelSlim's int8 ``weight`` (the module docstring's two layouts) -> uint8 [n, k], signed value + 8."""
    if not packed:  # MindIE's safe_tensor layout: one signed value a byte
        if w.shape[0] != n or int(w.min()) < -8 or int(w.max()) > 7:
            raise ValueError(f"an unpacked W4A16 weight must be int8 [{n}, k] in -8..7 (the description has no "
                             f"version: MindIE's layout), got {tuple(w.shape)} in {int(w.min())}..{int(w.max())}")
        return (w.to(torch.int16) + 8).to(torch.uint8)
    if per_group:  # ascendV1 per group: two rows a byte, row 2i in the low nibble
        if 2 * w.shape[0] != n:
            raise ValueError(f"a per-group ascendV1 W4A16 weight packs rows in pairs: [{n // 2}, k] for {n} scale "
                             f"rows, got {tuple(w.shape)}")
        return (nibbles_low_first(w.T, n).T ^ 0x08).contiguous()
    if w.shape[0] != n:
        raise ValueError(f"a per-channel ascendV1 W4A16 weight packs along the row: [{n}, k / 2], got {tuple(w.shape)}")
    return nibbles_low_first(w, 2 * w.shape[1]) ^ 0x08  # signed nibble s -> s + 8


def read_msmodelslim(p: dict[str, torch.Tensor], packed: bool = True, group: int | None = None) -> Int4Weight:
    """``packed``: the ascendV1 layout (the description has a version), else MindIE's unpacked one; ``group``: the
    description's group size."""
    scale = p["weight_scale"].float()
    n = scale.shape[0]
    scale = scale.reshape(n, -1)
    q = _msmodelslim_values(p["weight"], n, scale.shape[1] > 1, packed)
    off = p.get("weight_offset")
    # (weight - offset) * scale = ((weight + 8) - (offset + 8)) * scale: the zero point in q's domain is offset + 8
    zero = None if off is None or not off.any() else off.float().reshape(n, -1) + 8
    return Int4Weight(q, scale, zero, _group(q.shape[1], scale.shape[1], group))


# ---------------------------------------------------------------- which layout a folder holds
def _check_compressed_tensors(path: Path, qc: dict[str, Any]) -> int | None:
    """Refuses what we cannot read; returns the declared group size (None: channel-wise, or groups that differ)."""
    fmt = qc.get("format")
    sizes = set()
    for name, grp in (qc.get("config_groups") or {}).items():
        w = grp.get("weights") or {}
        gfmt = grp.get("format") or fmt
        if gfmt != "pack-quantized":
            raise _fail(path, f"compressed-tensors format {gfmt!r} (group {name}); W4A16 reads pack-quantized")
        if w.get("num_bits") != 4 or w.get("type") != "int" or grp.get("input_activations"):
            raise _fail(path, f"group {name} is not 4-bit int weights with float activations ({w})")
        if w.get("strategy") not in ("group", "channel"):
            raise _fail(path, f"group {name}: strategy {w.get('strategy')!r}; W4A16 reads group and channel")
        if w.get("actorder") not in (None, "weight", False):  # "group": activation-ordered groups (g_idx)
            raise _fail(path, f"group {name}: actorder {w.get('actorder')!r} (activation-ordered groups)")
        sizes.add(w.get("group_size") if w.get("strategy") == "group" else None)
    return sizes.pop() if len(sizes) == 1 else None


def detect(path: Path) -> W4Format | None:
    """The W4A16 layout of a checkpoint folder, None for any other checkpoint; a W4A16 one we cannot read is
    refused naming what."""
    qc = json.loads((path / "config.json").read_text()).get("quantization_config") or {}
    method = qc.get("quant_method")
    if method == "compressed-tensors":
        group = _check_compressed_tensors(path, qc)
        return W4Format("compressed-tensors", "weight_packed",
                        ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point", "weight_g_idx"),
                        functools.partial(read_compressed_tensors, group=group))
    if method == "awq":
        if str(qc.get("version", "gemm")).lower() != "gemm" or qc.get("bits", qc.get("w_bit", 4)) != 4:
            raise _fail(path, f"AutoAWQ {qc.get('version')!r} with {qc.get('bits')} bits; we read 4-bit gemm")
        group = qc.get("group_size", qc.get("q_group_size"))
        return W4Format("AutoAWQ gemm", "qweight", ("qweight", "qzeros", "scales"),
                        functools.partial(read_awq, group=group if isinstance(group, int) and group > 0 else None))
    desc_file = msmodelslim.find_description(path)
    if desc_file is None:
        return None
    desc = json.loads(desc_file.read_text())
    w4 = {k for k, v in desc.items() if v == "W4A16" and k.endswith(".weight")}
    if not w4:
        return None
    other = sorted({v for k, v in desc.items() if k.endswith(".weight") and v not in ("W4A16", "FLOAT")})
    if other:
        raise _fail(path, f"msModelSlim W4A16 mixed with {other}")
    packed = "version" in desc  # ascendV1 packs two values a byte; MindIE's safe_tensor layout does not
    return W4Format(f"msModelSlim W4A16 ({'ascendV1' if packed else 'MindIE'} layout)", "weight",
                    ("weight", "weight_scale", "weight_offset"),
                    functools.partial(read_msmodelslim, packed=packed, group=desc.get("group_size") or None), w4)


# ---------------------------------------------------------------- the tensors
def _index(path: Path) -> dict[str, Path]:
    idx: dict[str, Path] = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                idx[name] = file
    return idx


def _get(idx: dict[str, Path], name: str) -> torch.Tensor:
    with safe_open(str(idx[name]), framework="pt") as f:
        return f.get_tensor(name)


def modules(fmt: W4Format, idx: dict[str, Path]) -> dict[str, str]:
    """{module prefix: the marker tensor's name} of every quantized linear."""
    return {name[:-len(fmt.marker) - 1]: name for name in idx if fmt.is_quantized(name)}


def tensors(path: Path, fmt: W4Format, keep: bool, report: dict[str, str],
            blocks: bool = True) -> Iterator[tuple[str, Any]]:
    """The folder's tensors, each quantized linear as ``<module>.weight``: an Int4Weight with ``keep`` (and, for
    CPU ``blocks``, whole blocks of 32), else its fp32 value. ``report`` gets a line per quantized tensor and one
    for the whole."""
    idx = _index(path)
    mods = modules(fmt, idx)
    owned = {f"{m}.{part}" for m in mods for part in fmt.parts}
    for name in idx:
        if name not in owned:
            yield name, _get(idx, name)
    kinds: Counter[str] = Counter()
    held_n = 0
    for m in mods:
        parts = {part: _get(idx, f"{m}.{part}") for part in fmt.parts if f"{m}.{part}" in idx}
        if "weight_g_idx" in parts:
            raise _fail(path, f"{m} has weight_g_idx (activation-ordered groups)")
        try:
            w = fmt.read(parts)
        except (KeyError, ValueError, RuntimeError) as exc:
            raise _fail(path, f"{m}: {exc}") from exc
        what = f"{fmt.name} int4, group {w.group_size}, {'symmetric' if w.symmetric else 'asymmetric'}"
        unfit = blocks_unfit(w) if keep and blocks else None
        if unfit is not None:
            logger.warning("%s: %s.weight dequantized at load (%s)", path.name, m, unfit)
        kinds[what] += 1
        held = keep and unfit is None
        held_n += held
        how = f"as {block_kind(w)} blocks" if blocks else "for the device's int4 matmul"
        report[f"{m}.weight"] = f"{what}: " + (f"kept int4 {how}" if held else
                                                f"dequantized at load{f' ({unfit})' if unfit else ''}")
        yield f"{m}.weight", w if held else w.dequantize()
    report["W4A16"] = (f"{len(mods)} tensors ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}): "
                       f"{held_n} kept int4, {len(mods) - held_n} dequantized at load")

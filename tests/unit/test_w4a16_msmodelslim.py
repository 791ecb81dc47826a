"""msModelSlim W4A16 checkpoints as msModelSlim writes them (models/w4a16_checkpoint.py): the tensors here are made by
msModelSlim's own rules, restated from its source (Ascend/msmodelslim, commit 3de0a3c4):
- the value: ``deq_weight = (quant_weight - weight_offset) * weight_scale``, per group of columns when the scale has
  more than one column (msmodelslim/pytorch/llm_ptq/llm_ptq_tools/calibrator/calibrator_classes/fake_quantize/
  w8a16_w4a16_fakequantizer.py, lines 62 and 65); asymmetric offsets are signed integers beside signed int4 values;
- the storage: ``ComplexQuantifier`` (llm_ptq_tools/save/complex_quantifier.py) packs W4A16 only for ``ascendV1``
  (``_w4a16_pack_int4``: per channel, i.e. a one-column scale, it packs [n, k] along the row; per group it packs the
  transpose [k, n] along its rows and transposes back, [n / 2, k]; ``_pack_int4`` puts the first of each pair in the
  low nibble), and the ascendV1 description carries ``version`` (llm_ptq_utils.QuantModelJsonDescription); MindIE's
  ``safe_tensor`` layout keeps one signed value a byte, as its converter to AWQ (example/ms_to_vllm.py) reads it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mindie_service.models import w4a16_checkpoint

N, K, GROUP = 16, 256, 128


def pack_pairs(values: torch.Tensor) -> torch.Tensor:
    """msModelSlim's _pack_int4 on a 2-D int tensor [r, c]: consecutive pairs along c, the first in the low nibble,
    the second shifted left by 4 (int8 arithmetic) -> int8 [r, c / 2]."""
    v = values.to(torch.int8).reshape(-1, 2)
    return ((v[:, 1:] << 4) | (v[:, :1] & 0x0F)).reshape(values.shape[0], values.shape[1] // 2)


def w4a16_pack(weight: torch.Tensor, per_channel: bool) -> torch.Tensor:
    """msModelSlim's _w4a16_pack_int4 (trans_flag: the scale has one column)."""
    k_n = weight.T.contiguous()
    if per_channel:
        return pack_pairs(k_n.T.contiguous())
    return pack_pairs(k_n).T.contiguous()


def msmodelslim_value(weight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """The fake quantizer's dequantization, in float64 (exact) and rounded once to fp32 as ours is."""
    if scale.shape[1] == 1:
        return ((weight.double() - offset.double()) * scale.double()).float()
    g = K // scale.shape[1]
    w = weight.double().reshape(-1, g)
    deq = (w - offset.double().reshape(-1, 1)) * scale.double().reshape(-1, 1)
    return deq.reshape(weight.shape).float()


def case(groups: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randint(-8, 8, (N, K), generator=gen, dtype=torch.int8)
    scale = torch.rand(N, groups, generator=gen) * 0.01 + 1e-3
    offset = torch.randint(-4, 5, (N, groups), generator=gen).float()  # asymmetric: zero points off 0 both ways
    return weight, scale, offset


@pytest.mark.parametrize("groups", [1, K // GROUP], ids=["per-channel", "per-group"])
@pytest.mark.parametrize("packed", [True, False], ids=["ascendV1", "mindie"])
def test_values_follow_msmodelslims_weight_minus_offset_times_scale(groups, packed):
    weight, scale, offset = case(groups, seed=groups)
    stored = w4a16_pack(weight, groups == 1) if packed else weight
    got = w4a16_checkpoint.read_msmodelslim({"weight": stored, "weight_scale": scale, "weight_offset": offset},
                                            packed=packed)
    want = msmodelslim_value(weight, scale, offset)
    assert got.group_size == K // groups and torch.equal(got.dequantize(), want)
    plus = msmodelslim_value(weight, scale, -offset)  # the NPU op's (weight + offset) on the stored offset
    assert not torch.allclose(got.dequantize(), plus)


def _folder(tmp_path: Path, groups: int, version: bool) -> tuple[Path, torch.Tensor]:
    """A checkpoint folder with one W4A16 linear as msModelSlim saves it; the value it holds."""
    weight, scale, offset = case(groups, seed=7)
    name = "model.layers.0.mlp.down_proj"
    tensors = {f"{name}.weight": w4a16_pack(weight, groups == 1) if version else weight,
               f"{name}.weight_scale": scale, f"{name}.weight_offset": offset,
               "model.norm.weight": torch.ones(K)}
    desc = {"model_quant_type": "W4A16", **({"version": "1.0.0", "group_size": GROUP} if version else {}),
            **{f"{name}.{p}": "W4A16" for p in ("weight", "weight_scale", "weight_offset")},
            "model.norm.weight": "FLOAT"}
    save_file(tensors, str(tmp_path / "quant_model_weight_w4a16.safetensors"))
    (tmp_path / "quant_model_description_w4a16.json").write_text(json.dumps(desc))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return tmp_path, msmodelslim_value(weight, scale, offset)


@pytest.mark.parametrize("version", [True, False], ids=["ascendV1", "mindie"])
def test_the_description_says_which_layout_a_folder_holds(tmp_path, version):
    folder, want = _folder(tmp_path, K // GROUP, version)
    fmt = w4a16_checkpoint.detect(folder)
    assert fmt is not None and ("ascendV1" if version else "MindIE") in fmt.name
    report: dict[str, str] = {}
    got = dict(w4a16_checkpoint.tensors(folder, fmt, False, report))
    assert torch.equal(got["model.layers.0.mlp.down_proj.weight"], want)
    assert report["W4A16"].startswith("1 tensors")


def test_a_weight_in_the_other_layout_is_refused_not_misread(tmp_path):
    weight, scale, offset = case(K // GROUP, seed=3)
    parts = {"weight_scale": scale, "weight_offset": offset}
    with pytest.raises(ValueError, match="pairs"):  # MindIE's unpacked values read as ascendV1 per group
        w4a16_checkpoint.read_msmodelslim({"weight": weight, **parts}, packed=True)
    with pytest.raises(ValueError, match="-8..7"):  # ascendV1's packed bytes read as MindIE's values
        w4a16_checkpoint.read_msmodelslim({"weight": w4a16_pack(torch.cat([weight, weight]), False), **parts},
                                          packed=False)


@pytest.mark.parametrize("groups", [1, K // GROUP], ids=["per-channel", "per-group"])
def test_the_devkit_writes_msmodelslims_layouts(groups):
    from mindie_service.devkit import w4a16_writer
    from npu_ops.quant_w4a16 import Int4Weight
    weight, scale, offset = case(groups, seed=11)
    w = Int4Weight((weight.to(torch.int16) + 8).to(torch.uint8), scale, offset + 8, K // groups)
    ascend = w4a16_writer.encode(w, "msmodelslim", torch.float32)
    assert torch.equal(ascend["weight"], w4a16_pack(weight, groups == 1))
    assert torch.equal(ascend["weight_offset"], offset) and torch.equal(ascend["weight_scale"], scale)
    assert torch.equal(w4a16_writer.encode(w, "msmodelslim-mindie", torch.float32)["weight"], weight)

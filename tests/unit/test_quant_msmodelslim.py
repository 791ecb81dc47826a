"""msModelSlim checkpoints: what `mindie-service quantize` writes follows the published layout and loads
back; hand-built W8A16 (with offsets) and static W8A8 folders load and compute the published formulas."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from mindie_service import LLM, SamplingParams
from mindie_service.cli import main
from mindie_service.models.loader import load_model
from npu_ops import quant
from npu_ops.quant import QuantLinear

PARAMS = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
PROMPTS = ["the little fox ran to the river", "once upon a time"]


@pytest.fixture(scope="module")
def w8a8_dir(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("q") / "w8a8"
    assert main(["quantize", "--in", str(tiny_model), "--out", str(out), "--scheme", "w8a8"]) == 0
    return out


def test_quantize_writes_the_published_w8a8_dynamic_layout(w8a8_dir):
    desc = json.loads((w8a8_dir / "quant_model_description_w8a8_dynamic.json").read_text())
    assert desc["model_quant_type"] == "W8A8_DYNAMIC"
    assert json.loads((w8a8_dir / "config.json").read_text())["quantize"] == "w8a8_dynamic"
    name = "model.layers.0.self_attn.q_proj"
    assert desc[f"{name}.weight"] == desc[f"{name}.weight_scale"] == desc[f"{name}.weight_offset"] == "W8A8_DYNAMIC"
    assert desc["model.embed_tokens.weight"] == "FLOAT" and desc["lm_head.weight"] == "FLOAT"
    with safe_open(str(w8a8_dir / "quant_model_weight_w8a8_dynamic.safetensors"), framework="pt") as f:
        assert set(desc) - {"model_quant_type"} == set(f.keys())
        w, s, o = (f.get_tensor(f"{name}.{p}") for p in ("weight", "weight_scale", "weight_offset"))
    assert w.dtype == torch.int8 and s.shape == (w.shape[0], 1) and not o.any()


def test_what_quantize_wrote_loads_and_matches_quantizing_at_load(tiny_model, w8a8_dir):
    pre = load_model(w8a8_dir, "float32", torch.device("cpu"), 64).model
    assert sum(isinstance(m, QuantLinear) for m in pre.modules()) == 4 * pre.dims.layers
    got = [o.outputs[0].token_ids for o in LLM(str(w8a8_dir), num_kv_blocks=32, cache_block_size=16)
           .generate(PROMPTS, PARAMS, use_tqdm=False)]
    want = [o.outputs[0].token_ids for o in LLM(str(tiny_model), quantization="w8a8", num_kv_blocks=32,
                                                 cache_block_size=16).generate(PROMPTS, PARAMS, use_tqdm=False)]
    assert got == want  # the same int8 weights and scales either way


def test_quantize_refuses_bad_input(tmp_path, capsys):
    assert main(["quantize", "--in", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert "checkpoint folder" in capsys.readouterr().err


def _rewrite(src, dst, fn):
    """Copy a quantize output, rewriting its tensors and description with fn(tensors, desc)."""
    shutil.copytree(src, dst)
    wfile = next(dst.glob("quant_model_weight*.safetensors"))
    dfile = next(dst.glob("quant_model_description*.json"))
    with safe_open(str(wfile), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    desc = json.loads(dfile.read_text())
    fn(tensors, desc)
    save_file(tensors, str(wfile))
    dfile.write_text(json.dumps(desc))


def test_w8a16_offsets_and_static_w8a8_follow_the_formulas(w8a8_dir, tmp_path):
    name = "model.layers.1.mlp.down_proj"

    def w8a16_with_offset(t, d):
        for k in [k for k, v in d.items() if v == "W8A8_DYNAMIC"]:
            d[k] = "W8A16"
        t[f"{name}.weight"] = (t[f"{name}.weight"].to(torch.int16).clamp(-100, 100) + 5).to(torch.int8)
        t[f"{name}.weight_offset"] = torch.full_like(t[f"{name}.weight_offset"], 5.0)

    _rewrite(w8a8_dir, tmp_path / "a16", w8a16_with_offset)
    mod = load_model(tmp_path / "a16", "float32", torch.device("cpu"), 64).model.get_submodule("layers.1.mlp.down_proj")
    with safe_open(str(next((tmp_path / "a16").glob("*.safetensors"))), framework="pt") as f:
        w, s, o = (f.get_tensor(f"{name}.{p}") for p in ("weight", "weight_scale", "weight_offset"))
    x = torch.randn(3, mod.in_features)
    deq = (w.float() - o.reshape(-1, 1)) * s.reshape(-1, 1)  # the published dequantization
    torch.testing.assert_close(mod(x), x @ deq.T, rtol=1e-4, atol=1e-4)

    def static(t, d):
        n = t[f"{name}.weight"].shape[0]
        for p in ("weight_scale", "weight_offset"):
            del t[f"{name}.{p}"], d[f"{name}.{p}"]
        t[f"{name}.input_scale"], t[f"{name}.input_offset"] = torch.tensor([0.02]), torch.tensor([1.0])
        t[f"{name}.deq_scale"] = torch.full((n,), 1e-3).view(torch.int32).to(torch.int64)  # fp32 bits in int64
        t[f"{name}.quant_bias"] = torch.arange(n, dtype=torch.int32)
        for p in ("input_scale", "input_offset", "deq_scale", "quant_bias"):
            d[f"{name}.{p}"] = "W8A8"
        d[f"{name}.weight"] = "W8A8"

    _rewrite(w8a8_dir, tmp_path / "st", static)
    mod = load_model(tmp_path / "st", "float32", torch.device("cpu"), 64).model.get_submodule("layers.1.mlp.down_proj")
    assert mod.scheme == "w8a8_static" and mod.path == "reference"
    with safe_open(str(next((tmp_path / "st").glob("*.safetensors"))), framework="pt") as f:
        w = f.get_tensor(f"{name}.weight")
    xq = torch.clamp(torch.round(x / 0.02 + 1.0), -128, 127)
    want = (xq @ w.float().T + torch.arange(w.shape[0])) * 1e-3
    torch.testing.assert_close(mod(x), want, rtol=1e-4, atol=1e-4)


def test_unsupported_types_are_refused(w8a8_dir, tmp_path):
    def w4(t, d):
        d["model.layers.0.self_attn.o_proj.weight"] = "W4A16"

    _rewrite(w8a8_dir, tmp_path / "w4", w4)
    with pytest.raises(ValueError, match="W4A16"):
        load_model(tmp_path / "w4", "float32", torch.device("cpu"), 64)
    assert quant.SCHEMES == ("w8a16", "w8a8")

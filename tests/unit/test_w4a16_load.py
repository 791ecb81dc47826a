"""W4A16 checkpoints kept int4 (issue 44; models/w4a16_checkpoint.py, npu_ops/quant_w4a16.py): the tiny model's
decoder linears rounded to int4 and written by the devkit in each layout (compressed-tensors pack-quantized, group
128 and channel-wise, symmetric and asymmetric; AutoAWQ gemm; msModelSlim W4A16 in its ascendV1 and MindIE layouts)
load as GgufLinears over CPU blocks with the checkpoint's values, and greedy decoding gives token for token what
transformers gives on the same weights dequantized to float. The layouts are checked against their writers of
record: compressed-tensors' own pack_to_int32 / unpack_from_int32, AutoAWQ's packing loop (WQLinear_GEMM.from_linear)
written out here, msModelSlim's saver in tests/unit/test_w4a16_msmodelslim.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mindie_service import LLM, SamplingParams
from mindie_service.devkit import w4a16_writer
from mindie_service.models import w4a16_checkpoint
from mindie_service.models.loader import load_model
from npu_ops import cpu_kernels, quant_w4a16
from npu_ops.gguf_modules import GgufLinear
from npu_ops.quant_gguf import stored_kind
from tests.unit.test_fused_decode import count_fused_steps

pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")

PROMPTS = [[5, 9, 13, 2, 7], list(range(3, 40)), [11] * 20]
POOL = dict(cache_block_size=4, num_kv_blocks=128, max_seq_len=256)
FFN = 256  # the tiny model's MLP cut to whole groups of 128 (its own 352 is not)
ASYM = {"Q4_1", "Q4_1F"}  # Q4_1 where fp16 holds every -scale * zero of a shard, else Q4_1F
# (layout, group (None: channel-wise), symmetric, the scales' dtype, the CPU block types expected)
CASES = [pytest.param("compressed-tensors", 128, True, torch.bfloat16, {"Q4_0"}, id="ct-g128-sym-bf16"),
         pytest.param("compressed-tensors", 128, False, torch.float16, ASYM, id="ct-g128-asym-fp16"),
         pytest.param("compressed-tensors", None, True, torch.float16, {"Q4_0"}, id="ct-channel-sym-fp16"),
         pytest.param("compressed-tensors", None, False, torch.bfloat16, ASYM, id="ct-channel-asym-bf16"),
         pytest.param("awq", 128, False, torch.float16, ASYM, id="awq-g128"),
         # fp32 scales fp16 cannot hold: Q4_1F
         pytest.param("msmodelslim", 128, True, torch.float32, {"Q4_1F"}, id="msmodelslim-g128-sym-fp32"),
         pytest.param("msmodelslim", None, False, torch.float16, ASYM, id="msmodelslim-channel-asym"),
         pytest.param("msmodelslim-mindie", 128, False, torch.float32, ASYM, id="msmodelslim-mindie-g128-asym")]


@pytest.fixture(scope="module")
def tiny256(tiny_model, tmp_path_factory) -> Path:
    """The tiny demo model with its MLP cut to 256 (float32)."""
    out = tmp_path_factory.mktemp("tiny256")
    for f in Path(tiny_model).iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "devkit.json"):
            (out / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((Path(tiny_model) / "config.json").read_text())
    cfg["intermediate_size"] = FFN
    (out / "config.json").write_text(json.dumps(cfg))
    sd = load_file(str(Path(tiny_model) / "model.safetensors"))
    cut = {k: (v[:FFN] if "gate_proj" in k or "up_proj" in k else v[:, :FFN] if "down_proj" in k else v).contiguous()
           for k, v in sd.items()}
    save_file(cut, str(out / "model.safetensors"))
    return out


def _hf_greedy(folder: Path, n: int = 12) -> list[list[int]]:
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    outs = []
    for p in PROMPTS:
        ids = torch.tensor([p])
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=3)
        outs.append(out[0, len(p):].tolist())
    return outs


def _greedy(llm: LLM, n: int = 12) -> list[list[int]]:
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, [params] * len(PROMPTS), use_tqdm=False)]


@pytest.mark.parametrize("fmt,group,sym,sdt,kind", CASES)
def test_each_layout_loads_int4_and_decodes_as_transformers_on_the_dequantized_weights(tiny256, tmp_path, monkeypatch,
                                                                                        fmt, group, sym, sdt, kind):
    w4 = w4a16_writer.write(tiny256, tmp_path / "w4", fmt, group, sym, sdt)
    ref = w4a16_writer.reference(w4, tmp_path / "ref")
    llm = LLM(str(w4), dtype="float32", **POOL)
    model = llm.engine.runner.model
    layer = model.layers[1]
    for mod in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        assert isinstance(mod, GgufLinear) and {stored_kind(k) for k in mod.kinds} <= kind, mod
    assert model.weights_report["W4A16"].endswith(f"{7 * 4} kept int4, 0 dequantized at load")
    assert model.weights_report["model.layers.0.mlp.down_proj.weight"].rpartition(" as ")[2] in {f"{k} blocks"
                                                                                                  for k in kind}
    # the packed values are the checkpoint's, dequantized exactly
    want = load_file(str(ref / "model.safetensors"))["model.layers.1.mlp.down_proj.weight"]
    assert torch.equal(layer.mlp.down_proj.dequantized(), want)
    calls = count_fused_steps(monkeypatch)
    assert _greedy(llm) == _hf_greedy(ref)
    assert calls and all(calls)  # the one-call decode step (and its bursts) ran the blocks, Q4_1F's among them


def test_our_packing_is_compressed_tensors_own():
    ct = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")
    q = torch.randint(0, 16, (24, 256), dtype=torch.uint8)
    signed = (q.to(torch.int8) - 8)
    assert torch.equal(w4a16_writer._words_low_first(q), ct.pack_to_int32(signed, 4))
    assert torch.equal(quant_w4a16.nibbles_low_first(ct.pack_to_int32(signed, 4), 256), q)
    z = torch.randint(0, 16, (20, 2), dtype=torch.uint8)  # zero points pack down the rows (20: not whole words)
    w = quant_w4a16.Int4Weight(q[:20], torch.rand(20, 2), z.float(), 128)
    packed = w4a16_writer.encode(w, "compressed-tensors", torch.float16)["weight_zero_point"]
    assert torch.equal(packed, ct.pack_to_int32(z.to(torch.int8) - 8, 4, packed_dim=0))
    got = w4a16_checkpoint.read_compressed_tensors(
        w4a16_writer.encode(w, "compressed-tensors", torch.float16))
    assert torch.equal(got.q, w.q) and torch.equal(got.zero, w.zero)


def test_awq_layout_is_autoawq_gemm_packing():
    """AutoAWQ's WQLinear_GEMM.from_linear packs intweight [k, n] column by column through order_map."""
    k, n = 256, 32
    intweight = torch.randint(0, 16, (k, n), dtype=torch.int32)
    qweight = torch.zeros(k, n // 8, dtype=torch.int32)
    for col in range(n // 8):
        for i, src in enumerate([0, 2, 4, 6, 1, 3, 5, 7]):
            qweight[:, col] |= intweight[:, col * 8 + src] << (i * 4)
    zeros = torch.randint(0, 16, (k // 128, n), dtype=torch.int32)
    scales = torch.rand(k // 128, n).half()
    w = quant_w4a16.Int4Weight(intweight.T.to(torch.uint8).contiguous(), scales.float().T, zeros.T.float(), 128)
    enc = w4a16_writer.encode(w, "awq", torch.float16)
    assert torch.equal(enc["qweight"], qweight)
    got = w4a16_checkpoint.read_awq({"qweight": qweight, "qzeros": enc["qzeros"], "scales": scales})
    want = (intweight.T - zeros.T.repeat_interleave(128, 1)).float() * scales.float().T.repeat_interleave(128, 1)
    assert torch.equal(got.dequantize(), want)


def test_block_types_hold_the_values_exactly_and_the_kernels_match_the_reference():
    from npu_ops import gguf_cpu
    torch.manual_seed(0)
    w = torch.randn(40, 256) * 0.05
    pow2 = quant_w4a16.Int4Weight(torch.randint(0, 16, (40, 256), dtype=torch.uint8),
                                  2.0 ** -torch.randint(6, 9, (40, 2)).float(), torch.randint(0, 16, (40, 2)).float(),
                                  128)
    rtn = quant_w4a16.quantize_rtn
    for iw, kind in ((rtn(w, symmetric=True), "Q4_0"), (rtn(w), "Q4_1"),  # w4a16's scales: -scale * zero fp16-exact
                     (pow2, "Q4_1"), (rtn(w, symmetric=True, scale_dtype=torch.float32), "Q4_1F"),
                     (rtn(w[:, :224], symmetric=True), "Q4_0"), (rtn(w[:, :224]), "Q4_1")):  # 224: groups of 128, 96
        blocks = quant_w4a16.to_blocks(iw)
        assert blocks.kind == kind
        ref = iw.dequantize()
        x = torch.randn(6, ref.shape[1])
        assert torch.equal(blocks.dequantize(), ref)
        assert torch.equal(gguf_cpu.dequantize_row(blocks, 7), ref[7])
        for m in (1, 6):  # fp32 sums in another order only: within 1e-6 of |x| . |W|
            bound = 1e-6 * (x[:m].abs() @ ref.abs().T) + 1e-7
            assert ((gguf_cpu.matmul(x[:m], blocks) - x[:m] @ ref.T).abs() <= bound).all()


def test_rtn_error_is_within_half_a_step():
    torch.manual_seed(1)
    w = torch.randn(64, 576) * 0.02  # SmolLM2-135M's 576 columns: 4 groups of 128 and one of 64
    for sym in (True, False):
        iw = quant_w4a16.quantize_rtn(w, symmetric=sym)
        err = (iw.dequantize() - w).abs()
        assert (err <= iw.full(iw.scale) / 2 * (1 + 1e-3)).all()


def test_a_load_the_kernels_cannot_run_dequantizes_and_says_so(tiny256, tmp_path, monkeypatch, caplog):
    from mindie_service.models import gguf_packed
    w4 = w4a16_writer.write(tiny256, tmp_path / "w4", "awq", 128, False)
    monkeypatch.setattr(gguf_packed.cpu_kernels, "load", lambda: None)  # the CPU kernels off or not built
    with caplog.at_level("INFO"):
        loaded = load_model(w4, "float32", torch.device("cpu"), 256)
    assert any("dequantized at load (the CPU kernels are switched off or not built)" in r.getMessage()
               for r in caplog.records)
    assert loaded.weights_report["W4A16"].endswith("0 kept int4, 28 dequantized at load")
    assert not isinstance(loaded.model.layers[0].mlp.down_proj, GgufLinear)


@pytest.mark.parametrize("qc,why", [
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "gemm"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {"weights": {
        "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128,
        "actorder": "group"}}}}, "activation-ordered"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {"weights": {
        "num_bits": 8, "type": "float", "strategy": "channel"}}}}, "pack-quantized"),
], ids=["awq-gemv", "ct-actorder", "ct-fp8"])
def test_a_w4a16_checkpoint_we_cannot_read_is_refused_naming_why(tiny256, tmp_path, qc, why):
    w4 = w4a16_writer.write(tiny256, tmp_path / "w4", "compressed-tensors", 128, True)
    cfg = json.loads((w4 / "config.json").read_text())
    cfg["quantization_config"] = qc
    (w4 / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=why) as err:
        load_model(w4, "float32", torch.device("cpu"), 256)
    assert str(w4) in str(err.value)


def test_compressed_tensors_zero_points_unpacked_or_all_eight_are_read_as_such():
    q = torch.randint(0, 16, (16, 256), dtype=torch.uint8)
    base = {"weight_packed": w4a16_writer._words_low_first(q), "weight_scale": torch.rand(16, 2).half(),
            "weight_shape": torch.tensor([16, 256])}
    zp = torch.randint(-8, 8, (16, 2), dtype=torch.int8)
    got = w4a16_checkpoint.read_compressed_tensors({**base, "weight_zero_point": zp})
    assert torch.equal(got.zero, zp.float() + 8)
    eights = torch.full((2, 2), 0x88888888 - 2 ** 32, dtype=torch.int32)  # packed, every zero point 0 (stored 8)
    got = w4a16_checkpoint.read_compressed_tensors({**base, "weight_zero_point": eights})
    assert got.zero is None and quant_w4a16.block_kind(got) == "Q4_0"


def test_a_declared_group_size_leaves_the_last_group_of_a_row_shorter():
    """SmolLM2's 576 columns in groups of 128: 5 groups, the last of 64 (config.json's group_size says which)."""
    q = torch.randint(0, 16, (8, 576), dtype=torch.uint8)
    parts = {"weight_packed": w4a16_writer._words_low_first(q), "weight_scale": torch.rand(8, 5).half(),
             "weight_shape": torch.tensor([8, 576])}
    got = w4a16_checkpoint.read_compressed_tensors(parts, group=128)
    assert got.group_size == 128 and torch.equal(got.q, q)
    with pytest.raises(ValueError, match="do not split"):  # no declared size: 5 groups cannot split 576 evenly
        w4a16_checkpoint.read_compressed_tensors(parts)
    with pytest.raises(ValueError, match="do not cover"):
        w4a16_checkpoint.read_compressed_tensors(parts, group=64)

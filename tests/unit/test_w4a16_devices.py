"""The W4A16 device paths (npu_ops/w4a16_device.py) against the PyTorch reference, before they meet a device:
CUDA's int4 ops are played by stand-ins that check the documented contract (uint8 [n, k / 2] high nibble first,
inner_k_tiles, group sizes, bf16 scales_and_zeros [k / group, n, 2]) and compute with torch's own CPU kernels
(``_convert_weight_to_int4pack_for_cpu`` / ``_weight_int4pack_mm_for_cpu``), so our packing and zero formula are
checked by torch itself; torch_npu's ``npu_convert_weight_to_int4pack`` / ``npu_weight_quant_batchmatmul`` by
stand-ins that check their documented layouts (int32 [k, n / 8], [groups, n] scales and offsets in x's dtype,
``(w + offset) * scale``)."""
from __future__ import annotations

import sys
import types

import pytest
import torch

from npu_ops import quant_w4a16, w4a16_device
from npu_ops.w4a16_device import Int4Linear

A = torch.ops.aten


class CudaStandIn:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def _convert_weight_to_int4pack(self, w: torch.Tensor, tiles: int) -> torch.Tensor:
        n, half = w.shape
        assert w.dtype == torch.uint8 and tiles in (2, 4, 8) and (2 * half) % (tiles * 16) == 0 and n % 8 == 0
        self.calls.append("pack")
        q = torch.stack([w >> 4, w & 0x0F], dim=-1).reshape(n, -1).to(torch.int32)  # the high nibble first
        return A._convert_weight_to_int4pack_for_cpu(q, tiles)

    def _weight_int4pack_mm(self, x: torch.Tensor, wp: torch.Tensor, g: int, sz: torch.Tensor) -> torch.Tensor:
        assert x.dtype == sz.dtype == torch.bfloat16 and g in (32, 64, 128, 256)
        assert sz.shape == (x.shape[1] // g, wp.shape[0], 2)
        self.calls.append("mm")
        return A._weight_int4pack_mm_for_cpu(x, wp, g, sz)


def _weights() -> list[quant_w4a16.Int4Weight]:
    torch.manual_seed(0)
    w = torch.randn(32, 512) * 0.05  # n a multiple of 16: the CPU op's contract (CUDA's asks 8)
    return [quant_w4a16.quantize_rtn(w, symmetric=True), quant_w4a16.quantize_rtn(w, symmetric=False),
            quant_w4a16.quantize_rtn(w, group_size=512, symmetric=True),
            quant_w4a16.quantize_rtn(w, group_size=512, symmetric=False)]


@pytest.mark.parametrize("i", range(4))
def test_cuda_int4_path_matches_the_reference(monkeypatch, i):
    stand_in = CudaStandIn()
    monkeypatch.setattr(w4a16_device, "_aten", lambda: stand_in)
    w = _weights()[i]
    x = torch.randn(5, 512)
    packed = w4a16_device.cuda_pack(w, torch.device("cpu"))
    assert packed is not None
    y = stand_in._weight_int4pack_mm(x.to(torch.bfloat16), *packed).float()
    xb = x.to(torch.bfloat16).float()  # the op's inputs in bf16: its error is bf16's
    ref = xb @ w.dequantize().T
    bound = 2 ** -7 * (xb.abs() @ w.dequantize().abs().T) + 1e-3
    assert ((y - ref).abs() <= bound).all()
    assert stand_in.calls == ["pack", "mm"]


def test_cuda_shapes_outside_the_contract_run_the_reference(monkeypatch):
    monkeypatch.setattr(w4a16_device, "_aten", lambda: CudaStandIn())
    w = quant_w4a16.quantize_rtn(torch.randn(12, 128))  # n = 12: not a multiple of 8
    assert w4a16_device.cuda_pack(w, torch.device("cpu")) is None
    x = torch.randn(3, 128)
    torch.testing.assert_close(Int4Linear(w)(x), x @ w.dequantize().T)


def _npu_stand_in(calls: list) -> types.SimpleNamespace:
    def convert(w: torch.Tensor) -> torch.Tensor:
        assert w.dtype == torch.int32 and w.shape[1] % 8 == 0 and w.min() >= -8 and w.max() <= 7
        nib = (w & 0x0F).reshape(w.shape[0], -1, 8)
        return sum(nib[..., i] << (4 * i) for i in range(8)).to(torch.int32)  # 8 values a word, low first

    def wqbmm(x, weight, antiquant_scale, antiquant_offset=None, antiquant_group_size=0, bias=None):
        k, n = weight.shape[0], weight.shape[1] * 8
        assert weight.dtype == torch.int32 and x.shape[1] == k and antiquant_scale.dtype == x.dtype
        g = antiquant_group_size
        want = (n,) if g == 0 else (k // g, n)
        assert tuple(antiquant_scale.shape) == want and (g == 0 or g % 32 == 0)
        assert antiquant_offset is None or (antiquant_offset.shape == antiquant_scale.shape
                                            and antiquant_offset.dtype == x.dtype)
        calls.append(g)
        q = ((weight.unsqueeze(-1) >> (4 * torch.arange(8))) & 0x0F).reshape(k, n)
        q = torch.where(q > 7, q - 16, q).float()
        rep = k if g == 0 else g
        s = antiquant_scale.float().reshape(-1, n).repeat_interleave(rep, 0)
        o = 0 if antiquant_offset is None else antiquant_offset.float().reshape(-1, n).repeat_interleave(rep, 0)
        return (x.float() @ ((q + o) * s)).to(x.dtype)

    return types.SimpleNamespace(npu_convert_weight_to_int4pack=convert, npu_weight_quant_batchmatmul=wqbmm)


def test_npu_int4_path_matches_the_reference(monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "torch_npu", _npu_stand_in(calls))
    x = torch.randn(5, 512)
    for w in _weights():
        packed = w4a16_device.npu_pack(w, torch.device("cpu"), torch.float32)
        y = sys.modules["torch_npu"].npu_weight_quant_batchmatmul(x, packed[0], packed[1], antiquant_offset=packed[2],
                                                                  antiquant_group_size=packed[3])
        torch.testing.assert_close(y, x @ w.dequantize().T, rtol=1e-5, atol=1e-5)
    assert calls == [128, 128, 0, 0]


def test_a_device_model_gets_int4_linears_with_the_cpu_blocks_values(tiny_model, monkeypatch):
    """install_int4 without blocks (a CUDA or Ascend model): each projection an Int4Linear over its shards stacked,
    giving what the CPU blocks give (their values are the same; fp32 sums in another order only)."""
    from mindie_service.models import loader, quantize
    from npu_ops.gguf_modules import GgufLinear
    monkeypatch.setattr(loader, "_pack", lambda *a, **k: None)  # keep the dense weights to requantize twice
    dev = loader.load_model(tiny_model, "float32", torch.device("cpu"), 64).model
    cpu = loader.load_model(tiny_model, "float32", torch.device("cpu"), 64).model
    assert quantize.requantize_w4a16(dev, blocks=False) == quantize.requantize_w4a16(cpu, blocks=True) == 4 * 4
    for name in ("layers.0.self_attn.qkv_proj", "layers.2.mlp.gate_up_proj", "layers.3.self_attn.o_proj",
                 "layers.1.mlp.down_proj"):  # 352 inputs: two groups of 128 and one of 96
        a, b = dev.get_submodule(name), cpu.get_submodule(name)
        x = torch.randn(3, a.in_features)
        assert isinstance(a, Int4Linear) and isinstance(b, GgufLinear)
        torch.testing.assert_close(a(x), b(x), rtol=1e-5, atol=1e-5)
    assert dev.layers[1].mlp.down_proj.weight_q.scale.shape == (128, 3)

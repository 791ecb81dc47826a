"""The fused decoder layers (npu_ops/csrc/layers_f32.c) over int8 weights: every projection W8A8 or W8A16
(packed for the CPU kernels, npu_ops/quant.py) runs in the one C call per step and its output is
bit-identical to the op-by-op int8 path's, on odd shapes (hidden 40, q 60, qkv 100, intermediate 21: K not a
multiple of 4, N not whole panels), for a step mixing decode rows with prefill rows; with this machine's
build and with the AVX2 build (no AVX-512: W8A8's sign-trick core, W8A16's widened panels) where it differs."""
from __future__ import annotations

import ctypes

import pytest
import torch

from mindie_service.models.llama import LlamaDims
from npu_ops import cpu_kernels, quant, quant_cpu
from tests.unit.test_fused_layers import BS, _model, _run, fused_and_op_by_op

# a team of two threads, whatever the worker's: the fused decoder's splits and barriers are under test
pytestmark = [
    pytest.mark.skipif(cpu_kernels.load() is None or not quant_cpu.available(), reason="no C kernels here"),
    pytest.mark.usefixtures("two_threads"),
]


@pytest.fixture(scope="module")
def avx2_kernels() -> ctypes.CDLL:
    """The same sources built without AVX-512; skipped where this machine's build already is that one."""
    if quant_cpu.w8a8_core() != "vnni":
        pytest.skip("the loaded build already runs the AVX2 cores")
    lib = cpu_kernels.build_variant(cpu_kernels.AVX2_ONLY)
    assert quant_cpu.w8a8_core(lib) == "maddubs"
    return cpu_kernels._declare(lib)


@pytest.mark.parametrize("scheme", ["w8a8", "w8a16"])
# 150: a lone row's silu in 3 parts; W8A8 with inter a multiple of the panel width takes a lone row's silu in the
# gate/up epilogue: 32 (a pair a thread), 320 (groups of pairs and a rest, with bias)
@pytest.mark.parametrize("inter,bias", [(21, True), (32, False), (150, False), (320, True)])
def test_fused_int8_layers_equal_the_op_by_op_int8_path(scheme, inter, bias):
    _check(scheme, inter, bias)


@pytest.mark.parametrize("scheme", ["w8a8", "w8a16"])
@pytest.mark.parametrize("inter", [21, 320])
def test_fused_int8_layers_on_the_avx2_build(scheme, inter, avx2_kernels, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "load", lambda: avx2_kernels)  # every kernel of the test from that build
    _check(scheme, inter, True)


def _check(scheme: str, inter: int, bias: bool) -> None:
    model = _model(inter, bias, seed=inter + 7)
    d = model.dims
    dense = _run(model, torch.zeros(d.layers, 2, 16, BS, d.kv_heads, d.head_dim), True)
    assert quant.quantize_model(model, scheme, keep_float=("lm_head",)) == 4 * d.layers
    assert quant.pack_quantized(model) == 4 * d.layers
    fused, op_by_op = fused_and_op_by_op(model)
    for a, b, f in zip(fused, op_by_op, dense):
        assert torch.equal(a, b)
        assert not torch.equal(a, f)  # the int8 weights were used
        assert (a - f).norm() < 0.1 * f.norm()  # and stay near the fp32 weights' output


def test_a_lone_w8a8_row_with_a_slow_thread_has_the_same_bits():
    """A lone row's W8A8 projections split their panel pairs by stealing (team_work_* in team_sync.c): with thread 0
    sleeping before each claim of its own but the first, the others take the rest of its share from the back
    (counted), and every output keeps the op-by-op path's bits. Dims wide enough for shares of two rounds (qkv 500,
    o and down 300, gate/up 2 x 320 columns) in both kinds of pairs: a linear's and gate/up's."""
    d = LlamaDims(hidden=300, heads=6, kv_heads=2, head_dim=50, intermediate=320, layers=2, vocab=37, eps=1e-5,
                  qkv_bias=True, o_bias=True, mlp_bias=True, tie_embeddings=False)
    model = _model(d.intermediate, True, seed=11, d=d)
    assert quant.quantize_model(model, "w8a8", keep_float=("lm_head",)) == 4 * d.layers
    assert quant.pack_quantized(model) == 4 * d.layers
    lib = cpu_kernels.load()
    before = lib.team_work_stolen()
    lib.team_work_slow(0, 200)
    try:
        fused, op_by_op = fused_and_op_by_op(model)
    finally:
        lib.team_work_slow(-1, 0)
    assert lib.team_work_stolen() > before
    for a, b in zip(fused, op_by_op):
        assert torch.equal(a, b)

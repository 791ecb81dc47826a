"""The packed-linear self-check (npu_ops/linear.py) judges a packed GEMM by an fp32 error bound that grows
with K and the operands' magnitudes: a correct kernel passes on real-sized layers (K = 1536, small outputs),
a wrong one (one term lost, a relative error of 1e-3, one output off) is refused and F.linear kept."""
from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from npu_ops import linear
from npu_ops.linear import FastLinear, fp32_gemm_tolerance, within_fp32_gemm_error


def _layer(k: int, n: int, seed: int = 0) -> FastLinear:
    g = torch.Generator().manual_seed(seed)
    m = FastLinear(k, n, bias=False)
    with torch.no_grad():
        m.weight.copy_(torch.randn(n, k, generator=g) * 0.02)  # real layers' weight scale
    return m


def test_two_fp32_summation_orders_are_within_the_bound():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(3, 1536, generator=g), torch.randn(576, 1536, generator=g) * 0.02
    want = F.linear(x, w)
    # Another order of summation: blocks of 64 accumulated in reverse, the way a tiled kernel differs.
    got = sum(F.linear(x[:, i:i + 64], w[:, i:i + 64]) for i in reversed(range(0, 1536, 64)))
    assert not torch.allclose(got, want, rtol=0, atol=0)  # they do differ
    assert within_fp32_gemm_error(got, want, x, w)


@pytest.mark.parametrize("break_it", ["drop-term", "relative-1e-3", "one-output"])
def test_a_wrong_packed_result_is_refused(monkeypatch, caplog, break_it):
    m = _layer(1536, 64)
    w = m.weight.detach().clone()

    def wrong(kind, x, packed, out_features, bias):
        if break_it == "drop-term":
            w2 = w.clone()
            w2[:, 100] = 0
            return F.linear(x, w2, bias)
        y = F.linear(x, w, bias)
        if break_it == "relative-1e-3":
            return y * (1 + 1e-3)
        y[1, 7] += fp32_gemm_tolerance(x, w)[1, 7] * 4
        return y

    monkeypatch.setattr(linear, "_apply", wrong)
    monkeypatch.setattr(linear, "_pack", lambda kind, w, hint: w.clone())
    monkeypatch.setattr(linear, "onednn_linear_available", lambda: True)
    with caplog.at_level(logging.WARNING, logger="npu_ops.linear"):
        assert m.pack(8) is False
    assert m.packed is None and "disagrees" in caplog.text


def test_a_correct_packed_kernel_is_used(monkeypatch):
    m = _layer(1536, 576)
    monkeypatch.setattr(linear, "onednn_linear_available", lambda: True)
    monkeypatch.setattr(linear.cpu_kernels, "load", lambda: None)  # oneDNN's packing: another summation order
    if not linear.torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN in this PyTorch build")
    assert m.pack(8) is True and m.packed_kind == "onednn"

"""The int8 output projection option (EngineConfig.quantize_lm_head): W8I16 whatever the body's scheme,
the body quantized as before, the head kept float without the option."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from mindie_service.models.quantize import quantize_loaded
from npu_ops.linear import FastLinear
from npu_ops.quant import QuantLinear


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = FastLinear(64, 64, bias=False)
        self.lm_head = FastLinear(64, 300, bias=False)


@pytest.mark.parametrize("scheme", ["w8a8", "w8a16"])
def test_head_quantized_only_when_asked(scheme: str) -> None:
    plain, with_head = Tiny(), Tiny()
    x = torch.randn(5, 64)
    want = with_head.lm_head(x)
    quantize_loaded(plain, scheme)
    quantize_loaded(with_head, scheme, lm_head=True)
    assert isinstance(plain.proj, QuantLinear) and isinstance(plain.lm_head, FastLinear)
    assert isinstance(with_head.lm_head, QuantLinear) and with_head.lm_head.scheme == "w8i16"
    got = with_head.lm_head(x)
    assert got.shape == want.shape
    assert (got - want).abs().max() <= 0.02 * want.abs().max()

"""Quantized models at load: weights quantized after loading (npu_ops.quant), checkpoints already
quantized in msModelSlim's layout loaded as they are (models/msmodelslim.py), and the packing of
int8 weights for the CPU kernels."""
from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from mindie_service.models import msmodelslim
from npu_ops import quant

logger = logging.getLogger(__name__)


def quantize_loaded(model: nn.Module, scheme: str, lm_head: bool = False) -> None:
    """Quantize every linear of a loaded model (one module at a time: the float weight of each is freed
    before the next, so the model is never held twice). The output projection only with ``lm_head``, and
    then as W8I16 whatever the scheme (npu_ops.quant): int8 weights (a quarter of the bytes each decoded token
    reads) with the final hidden state in int16, not int8: int8 activations flip near-tied top-1 tokens far
    more often (measured on SmolLM2-135M, tools/head_accuracy.py), int16 ones add nothing measurable to the
    weights' error."""
    n = quant.quantize_model(model, scheme)
    head = getattr(model, "lm_head", None)
    if lm_head and isinstance(head, nn.Linear) and head.weight is not None:
        new = quant.QuantLinear.from_float(head, quant.HEAD_SCHEME)
        quant.swap_module(model, "lm_head", new.to(head.weight.device))
        n += 1
    logger.info("quantized %d linear layers to %s", n, scheme)


def load_prequantized(model: nn.Module, path: Path, prefix_map: dict[str, str]) -> bool:
    """Load an msModelSlim checkpoint (a quant_model_description*.json beside the weights) into
    ``model``; False, touching nothing, for any other checkpoint."""
    desc = msmodelslim.find_description(path)
    if desc is None:
        return False
    msmodelslim.load(model, path, desc, prefix_map)
    return True


def pack_quantized(model: nn.Module, act_dtype: torch.dtype) -> int:
    return quant.pack_quantized(model, act_dtype)

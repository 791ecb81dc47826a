"""Quantized models at load: weights quantized after loading (npu_ops.quant; w4a16: npu_ops.quant_w4a16),
checkpoints already quantized in msModelSlim's layout loaded as they are (models/msmodelslim.py), int4 weights
installed (``install_int4``: a W4A16 checkpoint's or w4a16's), and the packing of int8 weights for the CPU
kernels."""
from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from mindie_service.models import gguf_packed, msmodelslim
from npu_ops import quant, quant_w4a16
from npu_ops.gguf_modules import GgufLinear
from npu_ops.quant_gguf import stored_kind
from npu_ops.quant_w4a16 import Int4Weight
from npu_ops.w4a16_device import Int4Linear

logger = logging.getLogger(__name__)


def quantize_loaded(model: nn.Module, scheme: str, lm_head: bool = False) -> None:
    """Quantize every linear of a loaded model (one module at a time: the float weight of each is freed
    before the next, so the model is never held twice). The output projection only with ``lm_head``, and
    then as W8I16 whatever the scheme (npu_ops.quant): int8 weights (a quarter of the bytes each decoded token
    reads) with the final hidden state in int16, not int8: int8 activations flip near-tied top-1 tokens far
    more often (measured on SmolLM2-135M, tools/head_accuracy.py), int16 ones add nothing measurable to the
    weights' error. ``w4a16`` requantizes to int4 (``requantize_w4a16``; the head stays float)."""
    n = requantize_w4a16(model) if scheme == "w4a16" else quant.quantize_model(model, scheme)
    head = getattr(model, "lm_head", None)
    if lm_head and isinstance(head, nn.Linear) and head.weight is not None:
        new = quant.QuantLinear.from_float(head, quant.HEAD_SCHEME)
        quant.swap_module(model, "lm_head", new.to(head.weight.device))
        n += 1
    logger.info("quantized %d linear layers to %s%s", n, scheme, " (int4 in groups of 128 columns, round to nearest, "
                "asymmetric)" if scheme == "w4a16" else "")


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


def requantize_w4a16(model: nn.Module, keep_float: tuple[str, ...] = quant.KEEP_FLOAT,
                     blocks: bool | None = None) -> int:
    """Every linear of a loaded float model but ``keep_float`` to int4 (npu_ops.quant_w4a16.quantize_rtn, groups
    of 128, a row's last group shorter where its inputs are not whole groups), one module at a time; a linear whose
    inputs are not whole blocks of 32 (the CPU kernels' unit) stays float, with a WARNING.
    ``blocks``: CPU blocks or a device's Int4Linear (``install_int4``); None: by where the model is."""
    kept: dict[str, dict[int, Int4Weight]] = {}
    for name, mod in list(model.named_modules()):
        if not isinstance(mod, nn.Linear) or name.rpartition(".")[2] in keep_float:
            continue
        if mod.weight is None or mod.in_features % quant_w4a16.QK:
            logger.warning("w4a16: %s stays float (its %d inputs are not whole blocks of %d)", name,
                           mod.in_features, quant_w4a16.QK)
            continue
        w = mod.weight.detach().float().cpu()
        attr = name.rpartition(".")[2]
        shards = any(pname == attr for pname, _ in getattr(model, "PACKED", {}).values())
        parts = w.split(model.shard_sizes(attr)) if shards else (w,)  # type: ignore[operator]
        kept[name] = {i: quant_w4a16.quantize_rtn(p) for i, p in enumerate(parts)}  # rows apart: split or not
    if blocks is None:
        blocks = next(model.parameters()).device.type == "cpu"
    return install_int4(model, kept, blocks)


def int4_report(model: nn.Module) -> dict[str, str]:
    """weights_report's line for the linears ``requantize_w4a16`` made int4 (empty when there are none)."""
    mods = [m for m in model.modules() if isinstance(m, Int4Linear) or
            (isinstance(m, GgufLinear) and {stored_kind(k) for k in m.kinds} <= {"Q4_0", "Q4_1", "Q4_1F"})]
    if not mods:
        return {}
    kinds = sorted({stored_kind(k) for m in mods for k in getattr(m, "kinds", ["device int4"])})
    return {"W4A16": f"{len(mods)} linears requantized at load (round to nearest, groups of {quant_w4a16.GROUP}, "
                     f"asymmetric): kept int4 as {', '.join(kinds)}"}


def install_int4(model: nn.Module, kept: dict[str, dict[int, Int4Weight]], blocks: bool = True) -> int:
    """Swap each module named in ``kept`` ({module: {shard: Int4Weight}}) for a GgufLinear over its weights
    repacked into CPU blocks with the same values (npu_ops.quant_w4a16.to_blocks), or without ``blocks`` (a model
    for CUDA or Ascend) an Int4Linear over its shards stacked (npu_ops.w4a16_device); returns how many."""
    if not blocks:
        for name, shards in kept.items():
            old = model.get_submodule(name)
            new = Int4Linear(quant_w4a16.cat_rows([shards[i] for i in sorted(shards)]), getattr(old, "bias", None))
            if new.weight_q.shape != (old.out_features, old.in_features):
                raise ValueError(f"{name}: int4 shards make {new.weight_q.shape}, the layer is "
                                 f"[{old.out_features}, {old.in_features}]")
            quant.swap_module(model, name, new)
        logger.info("%d int4 weights kept for the device's int4 matmul", len(kept))
        return len(kept)
    blocks_of = {m: {i: quant_w4a16.to_blocks(w) for i, w in shards.items()} for m, shards in kept.items()}
    n = gguf_packed.install(model, blocks_of)
    kinds = sorted({b.kind for s in blocks_of.values() for b in s.values()})
    if n:
        logger.info("%d int4 weights repacked into CPU blocks (%s) with the same values", n, ", ".join(kinds))
    return n

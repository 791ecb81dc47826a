"""The CPU-packed weights of a loaded model moved into one huge-page arena (npu_ops.memory.HugeArena), in
module order: the order a decode step streams them. On 4 KiB pages each page of a weight is a TLB miss and a
halt of the hardware prefetcher (it stops at page boundaries); SmolLM2-135M's projections are 0.3-1.8 MB each,
too small for huge pages of their own, so they share an arena."""
from __future__ import annotations

import logging

from torch import nn

from mindie_service.models import gguf_packed
from npu_ops import memory, quant_gguf_x4
from npu_ops.gguf_modules import GgufEmbedding
from npu_ops.linear import FastLinear
from npu_ops.quant import QuantLinear

logger = logging.getLogger(__name__)


def _cpu_packed(m: nn.Module) -> bool:
    if isinstance(m, FastLinear):
        return m.packed is not None and m.packed_kind == "csrc" and m.packed.device.type == "cpu"
    return isinstance(m, QuantLinear) and m.packed is not None and m.packed.device.type == "cpu"


def gather_packed(model: nn.Module) -> int:
    """Move every CPU-packed weight of ``model`` into one arena; returns its bytes (0: nothing packed). A GGUF
    weight kept as stored (models/gguf_packed.py) goes in once, however many modules read it (a tied head); a 4-bit
    one only linears read goes in with its rows 4 interleaved (npu_ops.quant_gguf_x4: the same values)."""
    mods = [m for m in model.modules() if _cpu_packed(m)]
    ggufs = [w for w in gguf_packed.packed_weights(model) if w.data.device.type == "cpu"]
    if not mods and not ggufs:
        return 0
    arena = memory.HugeArena(memory.HugeArena.room([m.packed for m in mods] + [w.data for w in ggufs]))
    for m in mods:  # each original is freed as its copy goes in
        m.packed = arena.copy_in(m.packed)
    embedded, x4 = {id(m.weight_q) for m in model.modules() if isinstance(m, GgufEmbedding)}, 0
    for w in ggufs:  # in module order too: the embeddings first, then the layers' projections
        if id(w) not in embedded:  # a linear's 4-bit rows go in 4 interleaved (csrc/gguf_x4.h: a lone row's speed)
            x4 += quant_gguf_x4.to_x4(w)
        w.data = arena.copy_in(w.data)
    logger.info("packed weights in one %.1f MB huge-page arena (%d tensors, %d of them 4-bit with their rows 4 "
                "interleaved)", arena.used / 1e6, len(mods) + len(ggufs), x4)
    return arena.used

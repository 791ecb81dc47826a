"""A GGUF's quantized weights kept as the file stores them (issue 44): which loads keep them, and the modules that
take them once the checkpoint's tensors are read.

A load keeps them packed on the CPU in fp32 with the C kernels built, without ``quantization`` (w8a16 / w8a8
requantize from the dequantized values) and without tensor parallelism (models/shard.py splits dense weights);
elsewhere every quantized tensor is dequantized at load as before, and the log says why. The loader's copy hands
over each kept weight by module and shard (q/k/v and gate/up are shards of one projection); each such module
becomes a ``GgufLinear`` over its parts in shard order (the parts may differ in block type), the embeddings a
``GgufEmbedding``, and a tied head a GgufLinear over the embeddings' own bytes: no weight is held twice."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from npu_ops import cpu_kernels, gguf_cpu
from npu_ops.gguf_modules import INT8_ALL, INT8_DECODE, GgufEmbedding, GgufLinear
from npu_ops.quant import swap_module
from npu_ops.quant_gguf import GgufWeight

logger = logging.getLogger(__name__)


def keep_packed(path: Path, device: torch.device, dtype: torch.dtype, quantization: str | None, shard: Any,
                wanted: bool = True) -> bool:
    """Whether this load keeps the file's quantized weights packed; the reason is logged where it does not."""
    why = ("not asked for" if not wanted else f"quantization {quantization} requantizes them" if quantization
           else "tensor parallelism shards dense weights" if shard is not None
           else f"the packed kernels run on the CPU, this model loads on {device.type}" if device.type != "cpu"
           else f"the packed kernels take fp32 activations, this model runs in {dtype}" if dtype != torch.float32
           else "the CPU kernels are switched off or not built" if cpu_kernels.load() is None else "")
    if why and wanted:
        logger.info("%s: quantized weights dequantized at load (%s)", path.name, why)
    return not why


def install(model: nn.Module, kept: dict[str, dict[int, Any]]) -> int:
    """Swap each module named in ``kept`` ({module: {shard: GgufWeight}}) for its packed one; returns how many."""
    for name, shards in kept.items():
        parts = [shards[i] for i in sorted(shards)]
        old = model.get_submodule(name)
        if isinstance(old, nn.Embedding):
            swap_module(model, name, GgufEmbedding(parts[0]))
            continue
        shards_of = [sub for sub, (pname, _) in getattr(model, "PACKED", {}).items() if pname == name.rpartition(".")[2]]
        if shards_of and len(parts) != len(shards_of):  # gguf_checkpoint keeps all of a projection's parts or none
            raise ValueError(f"{name}: some of its parts are packed GGUF weights and some are not")
        if sum(p.shape[0] for p in parts) != old.out_features or parts[0].shape[1] != old.in_features:
            raise ValueError(f"{name}: packed GGUF parts {[p.shape for p in parts]} do not make a "
                             f"[{old.out_features}, {old.in_features}] weight")
        swap_module(model, name, GgufLinear(merged(parts), getattr(old, "bias", None)))
    emb = getattr(model, "embed_tokens", None)
    if (isinstance(emb, GgufEmbedding) and "lm_head" not in kept
            and getattr(getattr(model, "dims", None), "tie_embeddings", False)):
        swap_module(model, "lm_head", GgufLinear([emb.weight_q]))  # the tied head reads the embeddings' bytes
    if kept:
        kinds = sorted({p.kind for s in kept.values() for p in s.values()})
        logger.info("%d weights kept packed as stored (%s)", len(kept), ", ".join(kinds))
    return len(kept)


def merged(parts: list[GgufWeight]) -> list[GgufWeight]:
    """Consecutive parts of one block type joined into one (q, k, v of one type: one kernel call, not three)."""
    out: list[GgufWeight] = []
    for p in parts:
        if out and out[-1].kind == p.kind:
            last = out.pop()
            p = GgufWeight(torch.cat([last.data, p.data]), p.kind, (last.shape[0] + p.shape[0], p.shape[1]))
        out.append(p)
    return out


def packed_weights(model: nn.Module) -> list[GgufWeight]:
    """Every GgufWeight of the model, once each (a tied head's is its embeddings')."""
    seen: dict[int, GgufWeight] = {}
    for m in model.modules():
        for w in (m.parts if isinstance(m, GgufLinear) else [m.weight_q] if isinstance(m, GgufEmbedding) else []):
            seen.setdefault(id(w), w)
    return list(seen.values())


def packed_values(model: nn.Module) -> int:
    """How many weight values the packed weights hold (the parameter count's share of them)."""
    return sum(w.shape[0] * w.shape[1] for w in packed_weights(model))


# GGUF activations (ModelConfig.ggufActivations), by the kind of step a call belongs to (the runner says which,
# gguf_modules.gguf_step), never by its row count: "int8" quantizes x per 16 columns (K-quants: 256) by llama.cpp's
# rule in decode steps (bursts and speculation's verify rows too: each row a sequence's next token), at any number
# of rows, and keeps prefill pieces on the fp32 kernels (exact against the dequantized weights), so a prompt's
# numerics do not depend on how much of it a prefix cache held; "int8-all" takes the int8 kernels in prefill pieces
# too (csrc/gemm_gguf_q8.c's GEMM: llama.cpp's own choice; no faster than the fp32 tiles, csrc/gemm_gguf_tile.c,
# prefill pieces take otherwise, tools/bench_gguf_kernels.py --tiles; and on SmolLM2's Q4_1 file it turns the
# first-hour answer's first token, a near-tie, from "The capital of France is Paris." to "L'Étoile..."); "fp32"
# never. The LM head keeps fp32 activations in every
# mode: its logits choose the token, and an int8 head flipped a 0.03-nat near-tie of that answer and added a quarter
# of the int8 path's mean KL.
ACTIVATIONS = {"int8": INT8_DECODE, "int8-all": INT8_ALL, "fp32": 0}


def set_activations(model: nn.Module, mode: str) -> dict[str, str]:
    """Every packed GgufLinear of ``model`` on the ``mode`` activations; returns weights_report's line (none without
    packed linears)."""
    if mode not in ACTIVATIONS:
        raise ValueError(f"ggufActivations must be one of {', '.join(ACTIVATIONS)}, got {mode!r}")
    lins = [m for m in model.modules() if isinstance(m, GgufLinear)]
    head = getattr(model, "lm_head", None)
    for m in lins:  # the head keeps fp32: its logits pick the token (an int8 head flipped SmolLM2's near-ties)
        m.int8_steps = ACTIVATIONS[mode] if m is not head else 0
    if not lins:
        return {}
    if mode == "fp32":
        return {"GGUF activations": "fp32 (weights dequantized in registers: the dequantized reference's values)"}
    kinds = sorted({p.kind for m in lins for p in m.parts if not gguf_cpu.has_int8_kernel(p.kind)})
    fp32_only = f"; {', '.join(kinds)} always fp32 (no int8 kernel)" if kinds else ""
    where = "decode and prefill steps" if mode == "int8-all" else "decode steps, fp32 in prefill pieces"
    return {"GGUF activations": f"int8 per 16 columns of x (per 256: K-quants) in {where} and fp32 in the LM head"
                                f"{fp32_only}"}


def splits_step_kinds(model: nn.Module) -> bool:
    """Whether a forward must not mix decode rows with a prompt's (some packed linear takes int8 activations in one
    kind of step only): the runner then runs them as separate pieces."""
    return any(isinstance(m, GgufLinear) and m.int8_steps not in (0, INT8_ALL) for m in model.modules())

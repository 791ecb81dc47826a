"""A decode step in one C call (npu_ops/csrc/decode_f32.c): embedding, rotary rows, every decoder layer (the
fused layers' table, models/fused_layers.py), the final norm and the LM head, into logits the runner returns.

The op-by-op step around the fused layers runs about twenty small PyTorch ops (metadata tensors, embedding,
index, norm, head), each several times slower than usual right after a step has streamed every weight through
the caches: about 0.5 ms of a 5.5 ms SmolLM2-135M step at one stream. Here the step's integers go to C in
``array`` buffers and the step's one PyTorch op allocates the logits. The
logits are bit-identical to the op-by-op path's (the same C row functions and team halves).

Used for steps of decodes only (one row per sequence, each sampled: no prefill, no draft verification, no
LoRA adapter) on a model the fused layers take, with an fp32 or GGUF (models/gguf_packed.py) embedding, fp32 rotary
tables, and an fp32 (C-packed), W8I16 or GGUF head. ``fused_layers.set_enabled(False)`` switches it off with the fused layers."""
from __future__ import annotations

import ctypes
import logging
from array import array
from typing import Any

import torch

from npu_ops import cpu_kernels, gguf_cpu
from npu_ops.gguf_modules import GgufEmbedding, GgufLinear
from npu_ops.linear import FastLinear
from npu_ops.quant import HEAD_SCHEME, QuantLinear
from mindie_service.models import fused_layers
from mindie_service.models.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)

_P, _I64, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class DecodeArgs(ctypes.Structure):
    """decode_f32.c's decode_f32_args, field for field."""
    _fields_ = [("layers", _P), *((n, _I64) for n in ("L", "hidden", "H", "KVH", "D", "inter", "vocab", "BS",
                                                       "rope_len")),
                ("eps", _F), ("scale", _F), *((n, _P) for n in ("embed", "rope_cos", "rope_sin", "final_norm",
                                                               "head_w", "head_bias", "head_scale")),
                ("head_kind", _I64), ("embed_kind", _I64), ("T", _I64), ("MB", _I64), ("nthreads", _I64),
                *((n, _P) for n in ("ids", "slots", "positions", "block_tables", "row_seq", "logits", "work"))]


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _head(model: Any) -> tuple[int, torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None:
    """(kind, packed weight, bias, scale) of a head the C step runs; None for any other."""
    h = model.lm_head
    if isinstance(h, FastLinear) and h.packed is not None and h.packed_kind == "csrc":
        return 0, h.packed, h.bias, None
    if isinstance(h, QuantLinear) and h.scheme == HEAD_SCHEME and h.packed is not None:
        return 3, h.packed, h.bias, h.w_scale
    if isinstance(h, GgufLinear) and h.packed is not None:
        return 4, h.packed, h.bias, None
    return None


def _embedding(model: Any) -> tuple[int, torch.Tensor] | None:
    """(kind, what decode_f32.c's embed points at): an fp32 table, or a GGUF embedding's segment table whose type has
    a row kernel; None for any other."""
    e = model.embed_tokens
    if isinstance(e, GgufEmbedding):
        w = e.weight_q
        return (1, gguf_cpu.segments([w])) if gguf_cpu.runnable(w.kind) is None and gguf_cpu.embeddable(w.kind) else None
    return (0, e.weight) if _f32(e.weight) else None


def _plain_llama(m: Any) -> bool:
    """The C step is LlamaForCausalLM's embed, forward and compute_logits: a subclass changing any is not it."""
    return isinstance(m, LlamaForCausalLM) and all(
        getattr(type(m), f) is getattr(LlamaForCausalLM, f) for f in ("embed", "forward", "compute_logits"))


def _f32(*ts: torch.Tensor | None) -> bool:
    return all(t is None or (t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous()) for t in ts)


class FusedDecode:
    """One model's fused decode step over one KV pool: the argument block, the logits and scratch buffers
    (sized for ``max_rows`` rows, regrown for a larger step)."""

    def __init__(self, model: Any, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], max_rows: int = 8) -> None:
        self.model, self.kv_caches, self.max_rows = model, kv_caches, max_rows
        self.args: DecodeArgs | None = None
        self.key: tuple[int, ...] = ()
        self._bufs: tuple[array, ...] = ()  # what the argument block's step fields point into

    def usable(self, rows: int) -> bool:
        """Whether the C step applies to this model now; (re)built when its packing, the KV pool or the size of
        the step outgrew what it was built for."""
        m = self.model
        if not fused_layers.enabled() or cpu_kernels.load() is None:
            return False
        fused = getattr(m, "_fused_layers", None)
        if fused is None:
            fused = m._fused_layers = fused_layers.FusedLayers()
        if not fused.refresh(m, self.kv_caches):
            return False
        if rows > self.max_rows:
            self.max_rows, self.key = max(rows, 2 * self.max_rows), ()
        key = (id(fused.table), id(m.lm_head), id(getattr(m.lm_head, "packed", None)))
        if key != self.key:
            self.key, self.args = key, self._setup(fused)
        return self.args is not None

    def _setup(self, fused: fused_layers.FusedLayers) -> DecodeArgs | None:
        m, lib, head, emb = self.model, cpu_kernels.load(), _head(self.model), _embedding(self.model)
        if (head is None or emb is None or fused.table is None or not _plain_llama(m)
                or m.rope_cos.shape[-1] != m.dims.head_dim
                or not _f32(m.rope_cos, m.rope_sin, m.norm.weight, head[2], head[3])):
            return None
        d, (kind, w, bias, scale) = m.dims, head
        # what the argument block points into, held: a tensor replaced later cannot be freed under it, nor its id
        # (the key above) reused by the new one
        self.keep = [fused.table, w, bias, scale, emb[1], m.rope_cos, m.rope_sin, m.norm.weight]
        # the step's scratch is the fused layers' work buffer (FusedLayers.scratch), which the engine drops when it
        # runs out of work; a GGUF head's threads take their temporaries there too (csrc/gguf_linear.c says why)
        self.work_floats = lib.decode_f32_work(self.max_rows, d.hidden, d.heads, d.kv_heads, d.head_dim,
                                               d.intermediate, d.vocab)
        self.seqs = array("i", range(self.max_rows))
        logger.info("decode steps run as one CPU kernel call (%s head)", {0: "fp32", 3: "W8I16", 4: "GGUF"}[kind])
        return DecodeArgs(
            layers=fused.table.data_ptr(), L=len(m.layers), hidden=d.hidden, H=d.heads, KVH=d.kv_heads,
            D=d.head_dim, inter=d.intermediate, vocab=d.vocab, BS=self.kv_caches[0][0].shape[1],
            rope_len=m.rope_cos.shape[0], eps=float(d.eps), scale=float(d.head_dim ** -0.5),
            embed=_ptr(emb[1]), embed_kind=emb[0], rope_cos=_ptr(m.rope_cos), rope_sin=_ptr(m.rope_sin),
            final_norm=_ptr(m.norm.weight), head_w=_ptr(w), head_bias=_ptr(bias), head_scale=_ptr(scale),
            head_kind=kind, row_seq=self.seqs.buffer_info()[0])

    def run(self, ids: list[int], positions: list[int], slots: list[int],
            tables: list[tuple[int, ...]]) -> torch.Tensor:
        """The logits [rows, vocab] of one decode row per sequence, after ``usable(len(ids))``. A new tensor each
        step: a step that failed and reruns its requests one by one keeps every rerun's logits."""
        logits = self._bind(array("q", ids), array("i", positions), tables)
        self._call(array("q", slots))
        return logits

    def run_steps(self, ids: list[int], positions: list[int], slots: list[list[int]],
                  tables: list[tuple[int, ...]]) -> tuple[list[list[int]], list[list[float]]] | torch.Tensor:
        """``len(slots)`` greedy decode steps in one C call (engine.sched.bursts; ``slots[s]``: each row's slot at
        step s), each step's first maxima the next step's tokens. Returns each row's tokens and their
        log-probabilities; where step 0's logits are not all finite, those logits instead (the sampler names the
        bad rows), and a later such step ends the run before it."""
        t, k = len(ids), len(slots)
        logits = self._bind(array("q", ids), array("i", positions), tables)
        flat = array("q", [x for step in slots for x in step])
        out_ids, out_lp, done = array("q", bytes(8 * t * k)), array("f", bytes(4 * t * k)), ctypes.c_int64(0)
        rc = cpu_kernels.load().llama_decode_steps_f32(ctypes.addressof(self.args), k, flat.buffer_info()[0],
                                                       out_ids.buffer_info()[0], out_lp.buffer_info()[0],
                                                       ctypes.addressof(done))
        if rc != 0:
            raise RuntimeError(f"llama_decode_steps_f32 failed with code {rc} (a token id, position or block out of "
                               "range)")
        n = done.value
        if n == 0:
            return logits
        ids_l, lps_l = out_ids.tolist(), out_lp.tolist()
        return [ids_l[r:n * t:t] for r in range(t)], [lps_l[r:n * t:t] for r in range(t)]

    def _bind(self, ids: array, positions: array, tables: list[tuple[int, ...]]) -> torch.Tensor:
        """Point the argument block at a step's ids, positions and block tables (held until the next step) and a
        new logits tensor, which it returns."""
        a, t = self.args, len(ids)
        assert a is not None and 0 < t <= self.max_rows
        mb = max(len(b) for b in tables)
        bufs = (ids, positions, array("i", [b for tb in tables for b in (*tb, *(0,) * (mb - len(tb)))]))
        a.ids, a.positions, a.block_tables = (b.buffer_info()[0] for b in bufs)
        logits = torch.empty(t, self.model.dims.vocab)
        a.T, a.MB, a.nthreads, a.logits = t, mb, torch.get_num_threads(), logits.data_ptr()
        a.work = self.model._fused_layers.scratch(self.work_floats).data_ptr()
        self._bufs = bufs
        return logits

    def _call(self, slots: array) -> None:
        a = self.args
        assert a is not None
        a.slots = slots.buffer_info()[0]
        rc = cpu_kernels.load().llama_decode_f32(ctypes.addressof(a))
        if rc != 0:
            raise RuntimeError(f"llama_decode_f32 failed with code {rc} (a token id, position or block out of range)")

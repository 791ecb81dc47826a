"""Hot ops: a portable PyTorch reference for each, and per-device fast paths.

The reference path is what the tests hold every fast path against. KV caches have the layout
``[num_blocks, block_size, num_kv_heads, head_dim]`` (the one Ascend's paged kernels take); a slot
is ``block * block_size + offset``."""
from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F

from npu_ops import cpu_kernels, quant_kv, triton_support
from npu_ops.device import atb_status

logger = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def _torch_npu() -> Any:
    return importlib.import_module("torch_npu")


def _on_npu(t: torch.Tensor) -> bool:
    return t.device.type == "npu"


def _triton_on(t: torch.Tensor) -> bool:
    """Triton kernels take this tensor: on CUDA, or on an NPU through triton-ascend (npu_ops.triton_support)."""
    kind = "npu" if _on_npu(t) else t.device.type
    return kind != "cpu" and triton_support.usable(kind)


@lru_cache(maxsize=None)
def _triton(op: str) -> Any:
    """The Triton kernel module of ``op`` (npu_ops/triton_<op>.py), imported at its first use: importing it
    imports triton, which only a device that runs the kernels needs."""
    module = importlib.import_module(f"npu_ops.triton_{op}")
    logger.info("Triton kernel %s in use", op)
    return module


# Ascend ATB's paged ops (_npu_reshape_and_cache, _npu_paged_attention) take fp16/bf16 caches with a block
# size that is a multiple of 16, head size in (0, 256] and block size x head size <= 128 x 128 (ATB's
# PagedAttentionOperation constraints). Any other cache runs the reference path on the NPU.
ATB_DTYPES = (torch.float16, torch.bfloat16)


def atb_problem(cache: torch.Tensor) -> str | None:
    """Why ATB's paged ops cannot take this KV cache [num_blocks, block_size, kv_heads, head_dim]; None if they can."""
    bs, hd = cache.shape[1], cache.shape[3]
    if cache.dtype not in ATB_DTYPES:
        return f"KV cache dtype {cache.dtype} (ATB takes float16 or bfloat16)"
    if bs % 16:
        return f"cacheBlockSize {bs} (ATB needs a multiple of 16)"
    if not 0 < hd <= 256 or bs * hd > 128 * 128:
        return f"head size {hd} with cacheBlockSize {bs} (ATB needs head size <= 256 and their product <= 16384)"
    found, why = atb_status()
    return None if found else why


@lru_cache(maxsize=None)
def _note_fallback(problem: str, instead: str = "the PyTorch reference path") -> None:
    logger.warning("NPU paged attention on %s: %s", instead, problem)


def _atb_ok(cache: torch.Tensor) -> bool:
    """ATB's paged ops take this cache; where not, which path runs instead is logged once per reason."""
    problem = atb_problem(cache)
    if problem is not None:
        ok, why = triton_support.status("npu")
        _note_fallback(problem, "Triton kernels (triton-ascend)" if ok else f"the PyTorch reference path ({why})")
    return problem is None


# ---------------------------------------------------------------- RMSNorm
def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Exactly Hugging Face's LlamaRMSNorm: normalise in fp32, cast back, then scale."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoder layer's residual add, then its next norm: (rms_norm(x + residual), x + residual)."""
    r = x + residual
    return rms_norm_ref(r, weight, eps), r


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.device.type == "npu":
        return _torch_npu().npu_rms_norm(x, weight, eps)[0]
    if x.device.type == "cpu" and cpu_kernels.supports(x, weight):
        return cpu_kernels.rms_norm(x, weight, eps)
    if x.dim() == 2 and _triton_on(x):
        return _triton("rms_norm").add_rms_norm(x, None, weight, eps)[0]
    return rms_norm_ref(x, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): one Triton kernel where Triton runs (the sum is written once and
    read once), else the add and ``rms_norm``'s own path (the CPU's bit for bit as before)."""
    if x.dim() == 2 and not _on_npu(x) and _triton_on(x):
        return _triton("rms_norm").add_rms_norm(x, residual, weight, eps)
    r = x + residual
    return rms_norm(r, weight, eps), r


# ---------------------------------------------------------------- rotary embedding
def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos, sin: [T, head_dim] (Hugging Face's rotate-half layout)."""
    return x * cos[:, None, :] + _rotate_half(x) * sin[:, None, :]


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    if x.device.type == "npu":
        # npu_rotary_mul takes [B, S, N, D] with cos/sin broadcast as [1, S, 1, D].
        return _torch_npu().npu_rotary_mul(x[None], cos[None, :, None], sin[None, :, None])[0]
    if x.device.type == "cpu" and x.stride(1) == x.shape[2] and cpu_kernels.supports(x, cos, sin):
        return cpu_kernels.rotary(x, cos, sin)
    if _triton_on(x):
        return _triton("rotary").rotary(x, cos, sin)
    return rotary_ref(x, cos, sin)


# ---------------------------------------------------------------- gated activation
def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2 * inter] (gate then up, the packed MLP projection) -> silu(gate) * up."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    if gate_up.device.type == "cpu" and gate_up.dim() == 2 and cpu_kernels.supports(gate_up):
        return cpu_kernels.silu_mul(gate_up)
    return silu_mul_ref(gate_up)


# ---------------------------------------------------------------- KV-cache write
def write_kv_ref(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 slots: torch.Tensor) -> None:
    """k, v: [T, kv_heads, head_dim] written at ``slots`` [T] (quantized first into an int8 cache)."""
    if quant_kv.is_quantized(k_cache):
        k, v = quant_kv.quantize(k), quant_kv.quantize(v)
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor) -> None:
    if _on_npu(k) and not quant_kv.is_quantized(k_cache) and _atb_ok(k_cache):
        _torch_npu()._npu_reshape_and_cache(key=k, value=v, key_cache=k_cache, value_cache=v_cache,
                                            slot_indices=slots.to(torch.int32))
        return
    if _triton_on(k) and k_cache.is_contiguous() and v_cache.is_contiguous():  # int8 pages and odd shapes too
        _triton("kv_write").write_kv(k_cache, v_cache, k, v, slots)
        return
    write_kv_ref(k_cache, v_cache, k, v, slots)


# ---------------------------------------------------------------- paged attention
@dataclass
class PrefillSpan:
    """One sequence computing ``n`` new tokens in this step, packed at ``start`` in the token dim."""

    start: int
    n: int
    ctx_len: int  # cached prefix + n
    ctx_slots: torch.Tensor | None  # [ctx_len] slots when part of the context comes from the cache
    table_row: int | None = None  # its row of AttentionMetadata.block_tables (the Triton kernel's tiles)


@dataclass
class AttentionMetadata:
    """How the packed tokens of one step attend. Decode tokens (one per sequence) come first."""

    slots: torch.Tensor  # [T] where each token's K/V is written
    num_decode: int = 0
    decode_block_gather: torch.Tensor | None = None  # [Bd, max_blocks] block ids (padded) of each context
    decode_mask: torch.Tensor | None = None  # [Bd, 1, 1, max_blocks * block_size] True where a key is real
    decode_block_tables: torch.Tensor | None = None  # [Bd, max_blocks] int32 (NPU kernels)
    decode_ctx_lens: torch.Tensor | None = None  # [Bd] int32 on the step's device
    decode_ctx_lens_host: torch.Tensor | None = None  # [Bd] int32 in host memory: ATB reads lengths on the host
    prefills: list[PrefillSpan] = field(default_factory=list)
    # Every query row of the step at once, for kernels that read the cache per row (the CPU kernel):
    block_tables: torch.Tensor | None = None  # [S, max_blocks] int32: each sequence's blocks, decodes first
    row_seq: torch.Tensor | None = None  # [T] int32: the block_tables row of each token
    row_pos: torch.Tensor | None = None  # [T] int32: each token's position in its sequence
    prefill_tiles: torch.Tensor | None = None  # the Triton kernel's prefill tiles, built by its first layer


def _gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Rows of the cache at ``slots`` (any shape) -> [*slots.shape, kv_heads, head_dim].

    index_select on a 2-D view copies whole rows and runs 2-3x faster on CPU than advanced indexing."""
    n_kv, hd = cache.shape[2], cache.shape[3]
    rows = cache.view(-1, n_kv * hd).index_select(0, slots.reshape(-1)).view(*slots.shape, n_kv, hd)
    return quant_kv.dequantize(rows, torch.float32) if quant_kv.is_quantized(cache) else rows


def _gather_blocks(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """Whole blocks [Bd, nb] -> [Bd, nb * block_size, kv_heads, head_dim]: whole-block rows copy
    ~2x faster than per-slot rows; the padding past each context is masked out."""
    nb_total, bs, n_kv, hd = cache.shape
    rows = cache.view(nb_total, -1).index_select(0, blocks.reshape(-1))
    rows = rows.view(blocks.shape[0], blocks.shape[1] * bs, n_kv, hd)
    return quant_kv.dequantize(rows, torch.float32) if quant_kv.is_quantized(cache) else rows


def _decode_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float) -> torch.Tensor:
    bd = meta.num_decode
    n_kv, hd = k_cache.shape[2], q.shape[-1]
    group = q.shape[1] // n_kv
    blocks, mask = meta.decode_block_gather, meta.decode_mask
    if blocks is None:  # derived from the kernels' int32 tables when only those were given
        blocks = meta.decode_block_tables.long()
        pos = torch.arange(blocks.shape[1] * k_cache.shape[1], device=q.device)
        mask = (pos[None, :] < meta.decode_ctx_lens[:, None])[:, None, None, :]
    k = _gather_blocks(k_cache, blocks).to(q.dtype).transpose(1, 2)  # [Bd, kv, L, D]
    v = _gather_blocks(v_cache, blocks).to(q.dtype).transpose(1, 2)
    # GQA without repeating K/V: the query heads of one KV head become that head's query rows.
    qg = q.view(bd, n_kv, group, hd)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)
    return out.reshape(bd, n_kv * group, hd)


def _prefill_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 span: PrefillSpan, scale: float) -> torch.Tensor:
    s, n = span.start, span.n
    qi = q[s:s + n].transpose(0, 1)[None]  # [1, H, n, D]
    if span.ctx_slots is None:
        ki = k[s:s + n].transpose(0, 1)[None]
        vi = v[s:s + n].transpose(0, 1)[None]
        out = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale, enable_gqa=True)
    else:
        ki = _gather(k_cache, span.ctx_slots).to(q.dtype).transpose(0, 1)[None]
        vi = _gather(v_cache, span.ctx_slots).to(q.dtype).transpose(0, 1)[None]
        q_pos = torch.arange(span.ctx_len - n, span.ctx_len, device=q.device)
        mask = torch.arange(span.ctx_len, device=q.device)[None, :] <= q_pos[:, None]
        out = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)


def paged_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                        v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """q: [T, heads, D]; k, v: [T, kv_heads, D] (already written to the cache). Returns [T, heads, D]."""
    out = torch.empty_like(q)
    if meta.num_decode:
        out[:meta.num_decode] = _decode_ref(q[:meta.num_decode], k_cache, v_cache, meta, scale)
    for span in meta.prefills:
        out[span.start:span.start + span.n] = _prefill_ref(q, k, v, k_cache, v_cache, span, scale)
    return out


def _host_lens(meta: AttentionMetadata) -> torch.Tensor:
    if meta.decode_ctx_lens_host is not None:
        return meta.decode_ctx_lens_host
    return meta.decode_ctx_lens.to(device="cpu", dtype=torch.int32)  # a device sync: runners set the host copy


def _decode_npu(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float) -> torch.Tensor:
    # Ascend's paged decode kernel reads the block tables directly: no gather of the context.
    out = torch.empty_like(q)
    _torch_npu()._npu_paged_attention(query=q, key_cache=k_cache, value_cache=v_cache,
                                      num_kv_heads=k_cache.shape[2], num_heads=q.shape[1], scale_value=scale,
                                      block_table=meta.decode_block_tables, context_lens=_host_lens(meta),
                                      out=out)
    return out


def _triton_rows(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                 scale: float, first: int = 0) -> torch.Tensor:
    """The Triton kernel over the step's query rows from ``first`` on: decode rows one a program, prefill spans
    that name their block-table row in tiles of several rows; returns [T - first, heads, D]."""
    assert meta.row_seq is not None and meta.row_pos is not None and meta.block_tables is not None
    kernels = _triton("attention")
    spans = [s for s in meta.prefills if s.table_row is not None and s.start >= first]
    tiled = sum(s.n for s in spans)
    if tiled == 0 or len(meta.prefills) != len(spans) or meta.num_decode + tiled != q.shape[0]:
        return kernels.paged_attention_rows(q[first:], k_cache, v_cache, meta.block_tables, meta.row_seq[first:],
                                            meta.row_pos[first:], scale)
    out = torch.empty_like(q)
    if first < meta.num_decode:
        kernels.paged_attention_rows(q[first:meta.num_decode], k_cache, v_cache, meta.block_tables,
                                     meta.row_seq[first:meta.num_decode], meta.row_pos[first:meta.num_decode], scale,
                                     out=out[first:meta.num_decode])
    if meta.prefill_tiles is None:  # once a step: every layer's tiles are the same
        meta.prefill_tiles = kernels.span_tiles([(s.start, s.table_row, s.ctx_len - s.n, s.n) for s in spans],
                                                q.shape[1] // k_cache.shape[2], q.device)
    kernels.paged_attention_tiles(q, k_cache, v_cache, meta.block_tables, meta.prefill_tiles, scale, out=out)
    return out[first:]


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """The dispatch table (docs/design.md, "Devices and their kernels"): the CPU's C kernels; on an NPU ATB's decode
    where it takes the cache, the rest through triton-ascend where installed; on CUDA Triton; else the reference."""
    rows = meta.row_seq is not None and k_cache.is_contiguous() and v_cache.is_contiguous()
    if quant_kv.is_quantized(k_cache):
        if meta.row_seq is not None and quant_kv.kernel_supports(q, k_cache, v_cache):  # int8 pages read in place
            return quant_kv.paged_attention_rows(q, k_cache, v_cache, meta.block_tables, meta.row_seq, meta.row_pos,
                                                 scale)
        if rows and _triton_on(q):
            if _on_npu(q):
                _atb_ok(k_cache)  # says once that ATB takes no int8 pages, and what runs instead
            return _triton_rows(q, k_cache, v_cache, meta, scale)
        return paged_attention_ref(q, k, v, k_cache, v_cache, meta, scale)
    if q.device.type == "cpu" and not _on_npu(q) and rows and cpu_kernels.supports(q, k_cache, v_cache):
        # Decode and prefill rows in one call, each reading its context in place through the block tables.
        return cpu_kernels.paged_attention_rows(q, k_cache, v_cache, meta.block_tables, meta.row_seq, meta.row_pos,
                                                scale)
    if _on_npu(q) and meta.num_decode and _atb_ok(k_cache):
        out = torch.empty_like(q)
        out[:meta.num_decode] = _decode_npu(q[:meta.num_decode], k_cache, v_cache, meta, scale)
        if meta.prefills and rows and _triton_on(q):
            out[meta.num_decode:] = _triton_rows(q, k_cache, v_cache, meta, scale, meta.num_decode)
            return out
        for span in meta.prefills:
            out[span.start:span.start + span.n] = _prefill_ref(q, k, v, k_cache, v_cache, span, scale)
        return out
    if rows and _triton_on(q):  # CUDA; an NPU cache ATB cannot take, or a step of prefills only
        return _triton_rows(q, k_cache, v_cache, meta, scale)
    # CUDA without Triton, the CPU without its kernel: the reference (SDPA picks flash kernels on CUDA).
    return paged_attention_ref(q, k, v, k_cache, v_cache, meta, scale)

"""Paged attention as a Triton kernel: every query row of a step (decode rows and prefill / chunked-prefill
rows over a cached prefix) reads its context in place through the block tables, as the CPU kernel does
(``cpu_kernels.paged_attention_rows``: the same row contract). Reference: ``ops.paged_attention_ref``.

One program takes one query row and one KV head with that head's query heads (GQA: the group is the tile's
M dimension, padded to 16 for ``tl.dot``), and walks the row's context (positions 0..row_pos: causal) in tiles
of ``BLOCK_N`` positions, each position's slot found through its block table, so any block size works.
Softmax is online in fp32. Pages are fp32 / fp16 / bf16 ``[num_blocks, block_size, kv_heads, head_dim]``,
or int8 rows with their fp32 scale in the row (``npu_ops.quant_kv``: ``head_dim + 4`` bytes a row,
per token and per head), dequantized in registers. The kernel reads only tensors (no host values), so a
CUDA graph can hold it with static block tables."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from npu_ops import quant_kv
from npu_ops.triton_support import next_pow2

BLOCK_N = 32  # context positions a tile


@triton.jit
def _rows_kernel(q_ptr, k_ptr, v_ptr, out_ptr, bt_ptr, seq_ptr, pos_ptr, scale,
                 stride_qt, stride_qh, stride_ot, stride_oh, bt_width, block_size, kv_heads,
                 GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, ROW: tl.constexpr, QUANT: tl.constexpr,
                 GP: tl.constexpr, DP: tl.constexpr, BLOCK_N: tl.constexpr):
    t = tl.program_id(0)
    kvh = tl.program_id(1)
    seq = tl.load(seq_ptr + t).to(tl.int64)
    pos = tl.load(pos_ptr + t)
    g = tl.arange(0, GP)
    d = tl.arange(0, DP)
    gmask = g < GROUP
    dmask = d < HEAD_DIM
    heads = kvh * GROUP + g
    q = tl.load(q_ptr + t * stride_qt + heads[:, None] * stride_qh + d[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, DP], tl.float32)
    n_ctx = pos + 1
    for start in range(0, n_ctx, BLOCK_N):
        p = start + tl.arange(0, BLOCK_N)
        pmask = p < n_ctx
        blk = tl.load(bt_ptr + seq * bt_width + p // block_size, mask=pmask, other=0).to(tl.int64)
        row = (blk * block_size + p % block_size) * kv_heads + kvh  # the (token, head) row of the pages
        kvmask = pmask[:, None] & dmask[None, :]
        k = tl.load(k_ptr + row[:, None] * ROW + d[None, :], mask=kvmask, other=0).to(tl.float32)
        v = tl.load(v_ptr + row[:, None] * ROW + d[None, :], mask=kvmask, other=0).to(tl.float32)
        if QUANT:  # int8 values then the row's fp32 scale: x = q * scale
            k_s = tl.load((k_ptr + row * ROW + HEAD_DIM).to(tl.pointer_type(tl.float32)), mask=pmask, other=0.0)
            v_s = tl.load((v_ptr + row * ROW + HEAD_DIM).to(tl.pointer_type(tl.float32)), mask=pmask, other=0.0)
            k = k * k_s[:, None]
            v = v * v_s[:, None]
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        s = tl.where(pmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        pr = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(pr, axis=1)
        acc = acc * alpha[:, None] + tl.dot(pr, v, input_precision="ieee")
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + t * stride_ot + heads[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=gmask[:, None] & dmask[None, :])


def paged_attention_rows(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                         row_seq: torch.Tensor, row_pos: torch.Tensor, scale: float,
                         out: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, heads, D]; caches [blocks, block_size, kv_heads, D] (or D + 4 int8 bytes); block_tables [S, width]
    int32; row_seq / row_pos [T]: each row's block-table row and position. Returns [T, heads, D] in q's dtype."""
    t, heads, hd = q.shape
    _, bs, kvh, row = k_cache.shape
    if heads % kvh:
        raise ValueError(f"{heads} query heads do not share {kvh} KV heads evenly")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the Triton paged attention reads contiguous KV pages")
    quant = quant_kv.is_quantized(k_cache)
    if (quant and row != quant_kv.row_bytes(hd)) or (not quant and row != hd):
        raise ValueError(f"KV rows of {row} elements do not hold head size {hd}")
    q = q if q.stride(-1) == 1 else q.contiguous()
    out = torch.empty_like(q, memory_format=torch.contiguous_format) if out is None else out
    if t == 0:
        return out
    group = heads // kvh
    bt = block_tables.to(torch.int32).contiguous()
    _rows_kernel[(t, kvh)](q, k_cache, v_cache, out, bt, row_seq.to(torch.int32).contiguous(),
                           row_pos.to(torch.int32).contiguous(), float(scale), q.stride(0), q.stride(1),
                           out.stride(0), out.stride(1), bt.shape[1], bs, kvh, GROUP=group, HEAD_DIM=hd, ROW=row,
                           QUANT=quant, GP=max(16, next_pow2(group)), DP=max(16, next_pow2(hd)), BLOCK_N=BLOCK_N)
    return out

"""Paged attention as a Triton kernel: every query row of a step (decode rows and prefill / chunked-prefill
rows over a cached prefix) reads its context in place through the block tables, as the CPU kernel does
(``cpu_kernels.paged_attention_rows``: the same row contract). Reference: ``ops.paged_attention_ref``.

One program takes a tile of query rows and one KV head with that head's query heads (GQA: the rows x the group
are the tile's M dimension) and walks the tile's context (causal: each row up to its own position) in tiles of
``BLOCK_N`` positions, each position's slot found through its block table, so any block size works. A decode
row is a tile of its own (its group padded to 16 rows for ``tl.dot``); a prefill span's rows go 64 (row, head)
pairs a tile (``span_tiles``), so each K/V tile is read once for all of them.
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
def _tiles_kernel(q_ptr, k_ptr, v_ptr, out_ptr, bt_ptr, tiles_ptr, scale,
                  stride_qt, stride_qh, stride_ot, stride_oh, bt_width, block_size, kv_heads,
                  GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, ROW: tl.constexpr, QUANT: tl.constexpr,
                  GP: tl.constexpr, DP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A tile: up to BLOCK_M consecutive query rows of one sequence (row0, seq, pos0, n) x one KV head's group."""
    tile = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    row0 = tl.load(tiles_ptr + tile * 4).to(tl.int64)
    seq = tl.load(tiles_ptr + tile * 4 + 1).to(tl.int64)
    pos0 = tl.load(tiles_ptr + tile * 4 + 2)
    n = tl.load(tiles_ptr + tile * 4 + 3)
    i = tl.arange(0, BLOCK_M * GP)  # (row of the tile, query head of the group), row-major
    m = i // GP
    g = i % GP
    d = tl.arange(0, DP)
    imask = (m < n) & (g < GROUP)
    dmask = d < HEAD_DIM
    heads = kvh * GROUP + g
    rows = row0 + m
    q = tl.load(q_ptr + rows[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
                mask=imask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
    qpos = pos0 + m  # causal: each row sees the positions up to its own
    m_i = tl.full([BLOCK_M * GP], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M * GP], tl.float32)
    acc = tl.zeros([BLOCK_M * GP, DP], tl.float32)
    n_ctx = pos0 + n
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
        s = tl.where(pmask[None, :] & (p[None, :] <= qpos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: position 0 is in every row's first tile
        alpha = tl.exp(m_i - m_new)
        pr = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(pr, axis=1)
        acc = acc * alpha[:, None] + tl.dot(pr, v, input_precision="ieee")
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + rows[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=imask[:, None] & dmask[None, :])


def rows_a_tile(group: int) -> int:
    """Query rows a prefill tile holds: 64 (row, head) pairs, a power of two for tl.arange."""
    return max(1, 64 // next_pow2(group))


def _launch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
            tiles: torch.Tensor, scale: float, out: torch.Tensor | None, lone: bool) -> torch.Tensor:
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
    if t == 0 or tiles.shape[0] == 0:
        return out
    group = heads // kvh
    # tl.dot wants 16 rows at least: a lone row pads its group to 16, a tile of several rows fills 64 with rows
    gp = max(16, next_pow2(group)) if lone else next_pow2(group)
    bm = 1 if lone else rows_a_tile(group)
    bt = block_tables.to(torch.int32).contiguous()
    _tiles_kernel[(tiles.shape[0], kvh)](q, k_cache, v_cache, out, bt, tiles, float(scale), q.stride(0), q.stride(1),
                                         out.stride(0), out.stride(1), bt.shape[1], bs, kvh, GROUP=group,
                                         HEAD_DIM=hd, ROW=row, QUANT=quant, GP=gp, DP=max(16, next_pow2(hd)),
                                         BLOCK_M=bm, BLOCK_N=BLOCK_N)
    return out


def paged_attention_rows(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                         row_seq: torch.Tensor, row_pos: torch.Tensor, scale: float,
                         out: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, heads, D]; caches [blocks, block_size, kv_heads, D] (or D + 4 int8 bytes); block_tables [S, width]
    int32; row_seq / row_pos [T]: each row's block-table row and position. Returns [T, heads, D] in q's dtype.
    Every row is a tile of its own, built on the device (no host value: a CUDA graph holds it)."""
    rows = torch.arange(q.shape[0], dtype=torch.int32, device=q.device)
    tiles = torch.stack([rows, row_seq.to(torch.int32), row_pos.to(torch.int32), torch.ones_like(rows)], 1)
    return _launch(q, k_cache, v_cache, block_tables, tiles.contiguous(), scale, out, True)


def span_tiles(spans: list[tuple[int, int, int, int]], group: int, device: torch.device) -> torch.Tensor:
    """(first row, block-table row, first position, rows) of each prefill span -> its tiles [n, 4] int32, of
    ``rows_a_tile(group)`` rows each (the query heads sharing a KV head: ``heads // kv_heads``)."""
    step = rows_a_tile(group)
    tiles = [(r + i, seq, pos + i, min(step, n - i)) for r, seq, pos, n in spans for i in range(0, n, step)]
    return torch.tensor(tiles, dtype=torch.int32).reshape(-1, 4).to(device)


def paged_attention_tiles(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                          tiles: torch.Tensor, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Prefill rows over their cached prefix, several query rows a program, so each K/V tile is read once for all of
    them (``tiles`` from ``span_tiles``); rows of q no tile names are left as they are in ``out``."""
    return _launch(q, k_cache, v_cache, block_tables, tiles, scale, out, False)

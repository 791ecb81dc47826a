"""Every Triton kernel under Triton's interpreter on CPU tensors, against the PyTorch reference it replaces:
odd block sizes, GQA ratios, a cached prefix (chunked prefill), int8 pages; fp32 / fp16 / bf16. Tiny shapes:
the interpreter runs each program in numpy. Triton reads TRITON_INTERPRET when a kernel is decorated, so it is
set before the kernel modules are imported. On a GPU, tools/device_check.py runs the same tests on CUDA tensors
(MINDIE_TRITON_DEVICE=cuda: compiled kernels, no interpreter)."""
from __future__ import annotations

import os

DEVICE = os.environ.get("MINDIE_TRITON_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.triton_interp import mend_scalar_index  # noqa: E402

pytest.importorskip("triton")
mend_scalar_index()  # triton <= 3.6 under NumPy >= 2.4 (tests/triton_interp.py)

from npu_ops import ops, quant, quant_kv  # noqa: E402
from npu_ops import triton_attention, triton_kv_write, triton_rms_norm, triton_rotary, triton_w8a8  # noqa: E402

def _on(*ts):
    """The kernels' inputs on the device under test (the references run on the CPU)."""
    return [t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in ts]


# The tolerance of each dtype (the interpreter's casts to bfloat16 truncate where a GPU rounds to nearest).
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 2e-2)}


def _pages(lens: list[int], bs: int, kvh: int, d: int, dtype: torch.dtype, g: torch.Generator, int8: bool):
    """Scattered block tables for sequences of ``lens`` tokens, every token's K/V written by the reference."""
    nblocks = [-(-n // bs) for n in lens]
    perm = (torch.randperm(sum(nblocks) + 2, generator=g) + 1).tolist()  # block 0 stays unused
    tables, i = [], 0
    for nb in nblocks:
        tables.append(perm[i:i + nb])
        i += nb
    shape = (sum(nblocks) + 3, bs, kvh, quant_kv.row_bytes(d) if int8 else d)
    kc = torch.zeros(shape, dtype=torch.int8 if int8 else dtype)
    vc = torch.zeros_like(kc)
    slots = torch.tensor([t[p // bs] * bs + p % bs for t, n in zip(tables, lens) for p in range(n)])
    k = torch.randn(len(slots), kvh, d, generator=g).to(dtype)
    v = torch.randn(len(slots), kvh, d, generator=g).to(dtype)
    ops.write_kv_ref(kc, vc, k, v, slots)
    width = max(nblocks)
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    return kc, vc, bt, tables, k, v


def _step(lens: list[int], new: list[int], bs: int, tables: list[list[int]], k, v):
    """The runner's metadata for a step: sequences with new == 1 decode (first), others prefill ``new`` tokens
    over a cached prefix of len - new."""
    order = sorted(range(len(lens)), key=lambda i: new[i] != 1)
    starts = [sum(lens[:i]) for i in range(len(lens))]
    rows_seq, rows_pos, take, spans = [], [], [], []
    for r, i in enumerate(order):
        first = lens[i] - new[i]
        if new[i] > 1:
            ctx = torch.tensor([tables[i][p // bs] * bs + p % bs for p in range(lens[i])])
            spans.append(ops.PrefillSpan(len(rows_seq), new[i], lens[i], ctx if first else None, table_row=r))
        for p in range(first, lens[i]):
            rows_seq.append(r)
            rows_pos.append(p)
            take.append(starts[i] + p)
    nd = sum(1 for i in order if new[i] == 1)
    width = max(len(t) for t in tables)
    bt = torch.tensor([tables[i] + [0] * (width - len(tables[i])) for i in order], dtype=torch.int32)
    pos = torch.tensor(rows_pos, dtype=torch.int32)
    meta = ops.AttentionMetadata(slots=torch.empty(0, dtype=torch.long), num_decode=nd, prefills=spans,
                                 block_tables=bt, row_seq=torch.tensor(rows_seq, dtype=torch.int32), row_pos=pos)
    if nd:
        meta.decode_block_tables, meta.decode_ctx_lens = bt[:nd], pos[:nd] + 1
    idx = torch.tensor(take)
    return meta, k[idx], v[idx]


CASES = [  # (dtype, block size, heads, kv heads, head dim, int8 pages)
    (torch.float32, 5, 4, 4, 16, False),  # odd block size, no GQA
    (torch.float16, 16, 8, 2, 32, False),  # GQA 4
    (torch.bfloat16, 3, 6, 2, 24, False),  # GQA 3, a head size that is not a power of two
    (torch.float32, 7, 4, 1, 16, True),  # int8 pages, MQA
    (torch.bfloat16, 16, 4, 2, 32, True),
]


@pytest.mark.parametrize("dtype,bs,heads,kvh,d,int8", CASES)
def test_paged_attention_rows_match_the_reference(dtype, bs, heads, kvh, d, int8):
    g = torch.Generator().manual_seed(bs * 31 + heads)
    lens, new = [2 * bs + 3, 1, 9, 19], [1, 1, 4, 19]  # decodes, a chunk over a cached prefix, a fresh prompt
    kc, vc, _, tables, k, v = _pages(lens, bs, kvh, d, dtype, g, int8)
    meta, k_rows, v_rows = _step(lens, new, bs, tables, k, v)
    q = torch.randn(meta.row_seq.shape[0], heads, d, generator=g).to(dtype)
    if int8:  # a fresh prompt's rows read their K/V from the pages too, as the CPU's int8 kernel does
        k_rows, v_rows = (quant_kv.dequantize(quant_kv.quantize(x), dtype) for x in (k_rows, v_rows))
    want = ops.paged_attention_ref(q, k_rows, v_rows, kc, vc, meta, d ** -0.5)
    got = triton_attention.paged_attention_rows(*_on(q, kc, vc, meta.block_tables, meta.row_seq, meta.row_pos),
                                                d ** -0.5).cpu()
    assert got.dtype == dtype and got.shape == q.shape
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)
    # as the ops dispatch it: decode rows one a program, each prefill span's rows in tiles of several
    meta.block_tables, meta.row_seq, meta.row_pos = _on(meta.block_tables, meta.row_seq, meta.row_pos)
    tiled = ops._triton_rows(*_on(q, kc, vc), meta, d ** -0.5).cpu()
    assert meta.prefill_tiles is not None and meta.prefill_tiles.shape[0] >= 2
    torch.testing.assert_close(tiled.float(), want.float(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype,int8", [(torch.float16, False), (torch.bfloat16, False), (torch.float32, True)])
def test_kv_write_matches_the_reference_and_skips_negative_slots(dtype, int8):
    g = torch.Generator().manual_seed(7)
    kvh, d, bs = 3, 20, 5
    shape = (4, bs, kvh, quant_kv.row_bytes(d) if int8 else d)
    want_k = torch.zeros(shape, dtype=torch.int8 if int8 else dtype)
    want_v, got_k, got_v = torch.zeros_like(want_k), torch.zeros_like(want_k), torch.zeros_like(want_k)
    qkv = torch.randn(6, 2 * kvh + 1, d, generator=g).to(dtype)  # k and v are strided views, as in the model
    qkv[2, 0] = 0  # a zero row: scale 1
    qkv[3, 1] = 0  # a row of exact ties: amax 31.75 gives scale 0.25, so 0.125, 0.375, -0.625 quantize to .5s
    qkv[3, 1, :4] = torch.tensor([31.75, 0.125, 0.375, -0.625])  # round half to even: 0, 2, -2
    k, v = qkv[:, :kvh], qkv[:, kvh:2 * kvh]
    slots = torch.tensor([3, 17, 0, 9, -1, 12])
    ops.write_kv_ref(want_k, want_v, k[slots >= 0], v[slots >= 0], slots[slots >= 0])
    got_k, got_v, k, v, slots = _on(got_k, got_v, k, v, slots)
    triton_kv_write.write_kv(got_k, got_v, k, v, slots)
    got_k, got_v = got_k.cpu(), got_v.cpu()
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)  # int8 rows and scales bit for bit too


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_add_rms_norm_matches_the_reference(dtype):
    g = torch.Generator().manual_seed(3)
    x, res = torch.randn(5, 40, generator=g).to(dtype), torch.randn(5, 40, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(40, generator=g)).to(dtype)
    want, want_r = ops.add_rms_norm_ref(x, res, w, 1e-5)
    got, got_r = (t.cpu() for t in triton_rms_norm.add_rms_norm(*_on(x, res, w), 1e-5))
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got_r.float(), want_r.float(), rtol=rtol, atol=atol)
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)
    xd, wd = _on(x, w)
    alone, same = triton_rms_norm.add_rms_norm(xd, None, wd, 1e-5)
    assert same is xd
    alone = alone.cpu()
    torch.testing.assert_close(alone.float(), ops.rms_norm_ref(x, w, 1e-5).float(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_matches_the_reference_on_strided_heads(dtype):
    g = torch.Generator().manual_seed(5)
    t, heads, d = 4, 3, 12
    packed = torch.randn(t, (heads + 2) * d, generator=g).to(dtype)
    x = packed[:, :heads * d].view(t, heads, d)  # q's heads inside the packed qkv rows: token stride > heads * d
    ang = torch.randn(t, d // 2, generator=g)
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(dtype), torch.cat([ang.sin()] * 2, -1).to(dtype)
    rtol, atol = TOL[dtype]
    got = triton_rotary.rotary(*_on(x, cos, sin)).cpu()
    torch.testing.assert_close(got.float(), ops.rotary_ref(x, cos, sin).float(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("m,bias", [(1, True), (19, False)])
def test_w8a8_matmul_matches_the_reference(m, bias):
    g = torch.Generator().manual_seed(m)
    n, k = 70, 100  # neither a multiple of 8: torch._int_mm refuses such shapes
    x = torch.randn(m, k, generator=g)
    wq, ws = quant.quantize_weight(torch.randn(n, k, generator=g))
    b = torch.randn(n, generator=g) if bias else None
    xq, xs = quant.quantize_rows(x)
    got = triton_w8a8.w8a8_matmul(*_on(xq, xs, wq, ws, b), torch.float32).cpu()
    torch.testing.assert_close(got, quant.w8a8_ref(x, wq, ws, b), rtol=1e-6, atol=1e-5)


def test_decode_shapes_of_a_w8a8_linear_on_cuda_take_the_triton_kernel(monkeypatch):
    """torch._int_mm refuses M <= 16 (every decode step): QuantLinear's CUDA path runs the Triton kernel there."""
    calls = []
    real = triton_w8a8.w8a8_matmul
    monkeypatch.setattr(quant.triton_support, "usable", lambda kind: kind == "cuda")
    monkeypatch.setattr(triton_w8a8, "w8a8_matmul", lambda *a: (calls.append(a[0].shape), real(*a))[1])
    g = torch.Generator().manual_seed(11)
    x = torch.randn(3, 48, generator=g)
    wq, ws = quant.quantize_weight(torch.randn(40, 48, generator=g))
    got = quant._cuda_w8a8(*_on(x, wq, ws), None).cpu()
    assert calls == [(3, 48)]
    torch.testing.assert_close(got, quant.w8a8_ref(x, wq, ws, None), rtol=1e-6, atol=1e-5)

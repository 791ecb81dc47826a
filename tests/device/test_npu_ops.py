"""Hot ops: the device-dispatching entry points against the portable references, and device choice."""
from __future__ import annotations

import pytest
import torch

from npu_ops import ops
from npu_ops.device import select_device

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
try:  # pragma: no cover - only where Ascend is present
    import torch_npu  # noqa: F401
    if torch.npu.is_available():
        DEVICES.append("npu")
except Exception:  # noqa: BLE001
    pass


def test_cpu_is_chosen_and_explained_without_accelerators():
    info = select_device()
    if not torch.cuda.is_available():
        assert info.type == "cpu" and "torch_npu" in info.reason


def test_requesting_an_absent_device_is_an_error():
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            select_device("cuda")


@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_matches_reference(device):
    x, w = torch.randn(7, 64), torch.rand(64) + 0.5
    got = ops.rms_norm(x.to(device), w.to(device), 1e-5).cpu()
    torch.testing.assert_close(got, ops.rms_norm_ref(x, w, 1e-5))


@pytest.mark.parametrize("device", DEVICES)
def test_rotary_matches_reference(device):
    x, ang = torch.randn(5, 4, 16), torch.rand(5, 8) * 6
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    got = ops.rotary(x.to(device), cos.to(device), sin.to(device)).cpu()
    torch.testing.assert_close(got, ops.rotary_ref(x, cos, sin))


def _dense_attention(q, k, v, scale):
    """Plain causal attention over one sequence, with K/V heads repeated for GQA."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) * scale
    n = q.shape[0]
    ctx = k.shape[0]
    mask = torch.arange(ctx)[None, :] <= torch.arange(ctx - n, ctx)[:, None]
    return torch.einsum("hqk,khd->qhd", s.masked_fill(~mask, float("-inf")).softmax(-1), v)


@pytest.mark.parametrize("device", DEVICES)
def test_paged_attention_matches_dense_attention(device):
    torch.manual_seed(0)
    bs, heads, kv_heads, d = 4, 4, 2, 8
    k_cache = torch.zeros(32, bs, kv_heads, d, device=device)
    v_cache = torch.zeros_like(k_cache)
    # Three sequences with scattered block tables: a decode (ctx 11), a fresh prefill (7), a prefill after a cached prefix (8 of 13).
    tables = [[5, 2, 9], [7, 1], [3, 12, 4, 30]]
    ctx_lens, new = [11, 7, 13], [1, 7, 5]
    full_k = [torch.randn(c, kv_heads, d) for c in ctx_lens]
    full_v = [torch.randn(c, kv_heads, d) for c in ctx_lens]
    q_all = [torch.randn(n, heads, d) for n in new]
    slot = lambda t, p: t[p // bs] * bs + p % bs  # noqa: E731
    for t, c, n, kk, vv in zip(tables, ctx_lens, new, full_k, full_v):  # the already-cached part
        pre = torch.tensor([slot(t, p) for p in range(c - n)], dtype=torch.long)
        if len(pre):
            ops.write_kv_ref(k_cache, v_cache, kk[:c - n].to(device), vv[:c - n].to(device), pre.to(device))
    q = torch.cat(q_all).to(device)
    k = torch.cat([kk[c - n:] for kk, c, n in zip(full_k, ctx_lens, new)]).to(device)
    v = torch.cat([vv[c - n:] for vv, c, n in zip(full_v, ctx_lens, new)]).to(device)
    slots = torch.tensor([slot(t, p) for t, c, n in zip(tables, ctx_lens, new) for p in range(c - n, c)], device=device)
    ops.write_kv(k_cache, v_cache, k, v, slots)
    L = ctx_lens[0]
    bt = torch.tensor([tables[0]])
    # Whole blocks are gathered: 12 key slots of which the last is padding, masked out.
    mask = (torch.arange(len(tables[0]) * bs) < L)[None, None, None, :]
    meta = ops.AttentionMetadata(slots=slots, num_decode=1,
                                 decode_block_gather=bt.to(device),
                                 decode_mask=mask.to(device),
                                 decode_block_tables=bt.to(torch.int32).to(device),
                                 decode_ctx_lens=torch.tensor([L], dtype=torch.int32, device=device),
                                 prefills=[ops.PrefillSpan(1, 7, 7, None),
                                           ops.PrefillSpan(8, 5, 13, torch.tensor([slot(tables[2], p) for p in range(13)],
                                                                                 device=device))])
    got = ops.paged_attention(q, k, v, k_cache, v_cache, meta, d ** -0.5).cpu()
    want = torch.cat([_dense_attention(qq, kk, vv, d ** -0.5) for qq, kk, vv in zip(q_all, full_k, full_v)])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    ref = ops.paged_attention_ref(q, k, v, k_cache, v_cache, meta, d ** -0.5).cpu()
    torch.testing.assert_close(got, ref)

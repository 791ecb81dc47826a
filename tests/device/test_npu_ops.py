"""Hot ops: the device-dispatching entry points against the portable references, and device choice.

Each test runs on every device this host has; on an NPU in the dtypes and block sizes ATB's paged ops
take (fp16/bf16, blocks of 16 and 128), with the context lengths on the host and a tolerance of 1e-2."""
from __future__ import annotations

import pytest
import torch

from npu_ops import ops
from npu_ops.device import select_device


def _npu_available() -> bool:
    try:  # pragma: no cover - only where Ascend is present
        import torch_npu  # noqa: F401
    except Exception:  # noqa: BLE001 - absent or unusable without CANN
        return False
    return bool(getattr(torch, "npu", None) and torch.npu.is_available())


HAS_NPU = _npu_available()
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else []) + (["npu"] if HAS_NPU else [])
# (device, dtype, block size, tolerance) for paged attention: what each device's fast path takes.
ATTENTION_CASES = [("cpu", torch.float32, 4, 1e-4), ("cpu", torch.float32, 16, 1e-4)]
if torch.cuda.is_available():
    ATTENTION_CASES += [("cuda", torch.float32, 16, 1e-4), ("cuda", torch.float16, 16, 1e-2)]
if HAS_NPU:
    ATTENTION_CASES += [("npu", dt, bs, 1e-2) for dt in (torch.float16, torch.bfloat16) for bs in (16, 128)]


def test_the_best_device_is_chosen_and_explained():
    info = select_device()
    want = "npu" if HAS_NPU else "cuda" if torch.cuda.is_available() else "cpu"
    assert info.type == want and info.reason
    if want != "npu":
        assert "torch_npu" in info.reason  # why the NPU was passed over


def test_requesting_an_absent_device_is_an_error():
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            select_device("cuda")
    if not HAS_NPU:
        with pytest.raises(ValueError, match="npu"):
            select_device("npu")


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


@pytest.mark.parametrize("device,dtype,bs,tol", ATTENTION_CASES)
def test_paged_attention_matches_dense_attention(device, dtype, bs, tol):
    torch.manual_seed(0)
    heads, kv_heads, d = 4, 2, 64
    k_cache = torch.zeros(32, bs, kv_heads, d, device=device, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    # Three sequences with scattered block tables: a decode (ctx 2 blocks + 3), a fresh prefill (7), and a
    # prefill of 5 after a cached prefix of one block + 3.
    tables = [[5, 2, 9], [7, 1], [3, 12, 4, 30]]
    ctx_lens, new = [2 * bs + 3, 7, bs + 8], [1, 7, 5]
    full_k = [torch.randn(c, kv_heads, d).to(dtype) for c in ctx_lens]
    full_v = [torch.randn(c, kv_heads, d).to(dtype) for c in ctx_lens]
    q_all = [torch.randn(n, heads, d).to(dtype) for n in new]
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
    # Whole blocks are gathered: the key slots past the context are padding, masked out.
    mask = (torch.arange(len(tables[0]) * bs) < L)[None, None, None, :]
    host_lens = torch.tensor([L], dtype=torch.int32)
    meta = ops.AttentionMetadata(slots=slots, num_decode=1,
                                 decode_block_gather=bt.to(device),
                                 decode_mask=mask.to(device),
                                 decode_block_tables=bt.to(torch.int32).to(device),
                                 decode_ctx_lens=host_lens.to(device), decode_ctx_lens_host=host_lens,
                                 prefills=[ops.PrefillSpan(1, 7, 7, None),
                                           ops.PrefillSpan(8, 5, ctx_lens[2],
                                                           torch.tensor([slot(tables[2], p) for p in range(ctx_lens[2])],
                                                                        device=device))])
    got = ops.paged_attention(q, k, v, k_cache, v_cache, meta, d ** -0.5).float().cpu()
    want = torch.cat([_dense_attention(qq.float(), kk.float(), vv.float(), d ** -0.5)
                      for qq, kk, vv in zip(q_all, full_k, full_v)])
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    ref = ops.paged_attention_ref(q, k, v, k_cache, v_cache, meta, d ** -0.5).float().cpu()
    torch.testing.assert_close(got, ref, rtol=tol, atol=tol)

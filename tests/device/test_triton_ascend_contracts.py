"""The NPU's middle branch: a cache or a row ATB's paged ops cannot take runs the Triton kernels through
triton-ascend where it is installed, before the reference. Stand-ins play the NPU (``AtbStandIn`` as torch_npu,
every tensor counts as on an NPU) and triton-ascend (Triton's interpreter on CPU tensors, the same kernels),
so the dispatch table of docs/design.md ("Devices and their kernels") is held without an NPU."""
from __future__ import annotations

import logging
import os

os.environ["TRITON_INTERPRET"] = "1"  # read by triton when the kernels are decorated: before they are imported

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.triton_interp import mend_scalar_index  # noqa: E402

pytest.importorskip("triton")
mend_scalar_index()  # triton <= 3.6 under NumPy >= 2.4 (tests/triton_interp.py)

from npu_ops import ops, quant_kv  # noqa: E402
from tests.device.test_npu_contracts import AtbStandIn, _decode_case, _reference  # noqa: E402


@pytest.fixture
def npu(monkeypatch):
    """(stand-in torch_npu, Triton ops called): ATB found, triton-ascend installed, tensors on the 'NPU'."""
    standin, called = AtbStandIn(), []
    real = ops._triton
    monkeypatch.setattr(ops, "_torch_npu", lambda: standin)
    monkeypatch.setattr(ops, "_on_npu", lambda t: True)
    monkeypatch.setattr(ops, "atb_status", lambda: (True, "stand-in"))
    monkeypatch.setattr(ops.triton_support, "status", {"npu": (True, "triton-ascend installed (stand-in)")}.get)
    monkeypatch.setattr(ops, "_triton", lambda op: (called.append(op), real(op))[1])
    ops._note_fallback.cache_clear()
    return standin, called


def _rows_meta(q, bt, host, prefill_rows: int = 0):
    """Every row of the step for the row kernels; the last ``prefill_rows`` rows are a chunk of sequence 0."""
    nd = q.shape[0] - prefill_rows
    seq = list(range(nd)) + [0] * prefill_rows
    pos = [int(n) - 1 for n in host] + list(range(int(host[0]) - prefill_rows - 1, int(host[0]) - 1))
    meta = ops.AttentionMetadata(slots=torch.empty(0, dtype=torch.long), num_decode=nd, block_tables=bt,
                                 decode_block_tables=bt, decode_ctx_lens=host, decode_ctx_lens_host=host,
                                 row_seq=torch.tensor(seq, dtype=torch.int32), row_pos=torch.tensor(pos,
                                                                                                    dtype=torch.int32))
    return meta


@pytest.mark.parametrize("dtype,bs", [(torch.float16, 8), (torch.bfloat16, 5)])
def test_a_cache_atb_refuses_runs_triton_ascend_not_the_reference(npu, dtype, bs, caplog):
    standin, called = npu
    with caplog.at_level(logging.WARNING, logger="npu_ops.ops"):
        q, kc, vc, bt, host = _decode_case(dtype, bs, torch.device("cpu"), d=32)
        got = ops.paged_attention(q, q[:, :2], q[:, :2], kc, vc, _rows_meta(q, bt, host), 32 ** -0.5)
    assert standin.calls == [] and called == ["kv_write", "attention"]
    assert f"cacheBlockSize {bs}" in caplog.text and "Triton kernels (triton-ascend)" in caplog.text
    torch.testing.assert_close(got.float(), _reference(q, kc, vc, bt, host, 32 ** -0.5), rtol=2e-2, atol=2e-2)


def test_int8_pages_on_the_npu_run_triton_ascend(npu):
    standin, called = npu
    q, kc, vc, bt, host = _decode_case(torch.float16, 16, torch.device("cpu"), d=32)  # fp16 pages, through ATB
    standin.calls.clear()
    k8, v8 = (torch.zeros(*kc.shape[:3], quant_kv.row_bytes(32), dtype=torch.int8) for _ in range(2))
    bs = kc.shape[1]
    slots = torch.tensor([int(b) * bs + o for row, n in zip(bt.tolist(), host.tolist()) for p, b in enumerate(row)
                          for o in range(bs) if p * bs + o < n])  # each sequence's context, quantized
    ops.write_kv(k8, v8, kc.view(-1, *kc.shape[2:])[slots], vc.view(-1, *vc.shape[2:])[slots], slots)
    assert torch.equal(k8.view(-1, *k8.shape[2:])[slots], quant_kv.quantize(kc.float()).view(-1, *k8.shape[2:])[slots])
    got = ops.paged_attention(q, q[:, :2], q[:, :2], k8, v8, _rows_meta(q, bt, host), 32 ** -0.5)
    want = _reference(q, quant_kv.dequantize(k8, torch.float32), quant_kv.dequantize(v8, torch.float32), bt, host,
                      32 ** -0.5)
    assert standin.calls == [] and called == ["kv_write", "attention"]
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


def test_atb_decodes_and_triton_ascend_takes_the_prefill_rows_of_the_same_step(npu):
    standin, called = npu
    q, kc, vc, bt, host = _decode_case(torch.float16, 16, torch.device("cpu"), d=32)
    chunk = torch.randn(4, q.shape[1], 32, generator=torch.Generator().manual_seed(2)).to(torch.float16)
    meta = _rows_meta(torch.cat([q, chunk]), bt, host, prefill_rows=4)
    meta.prefills = [ops.PrefillSpan(q.shape[0], 4, int(host[0]) - 1, None)]  # the reference would not read these
    got = ops.paged_attention(torch.cat([q, chunk]), q[:, :2], q[:, :2], kc, vc, meta, 32 ** -0.5)
    assert standin.calls == ["reshape_and_cache", "paged_attention"] and called == ["attention"]
    torch.testing.assert_close(got[:3].float(), _reference(q, kc, vc, bt, host, 32 ** -0.5), rtol=2e-2, atol=2e-2)
    # each chunk row attends causally over sequence 0's cached prefix: the reference row by row
    for i in range(4):
        n = int(host[0]) - 4 + i
        want = _reference(chunk[i:i + 1], kc, vc, bt[:1], torch.tensor([n], dtype=torch.int32), 32 ** -0.5)
        torch.testing.assert_close(got[3 + i:4 + i].float(), want, rtol=2e-2, atol=2e-2)

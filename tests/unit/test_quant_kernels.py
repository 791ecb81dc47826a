"""int8 weights and KV cache: the C kernels (csrc/gemm_int8.c, csrc/attention_int8.c) held against the one
PyTorch reference (npu_ops.quant, npu_ops.quant_kv), the accelerator paths against stand-ins written to
their documented contracts, and the config keys that switch them on."""
from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.runner.model_runner import kv_bytes_per_block
from npu_ops import cpu_kernels, ops, quant, quant_cpu, quant_kv

needs_kernel = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C compiler: CPU kernel not built")
SHAPES = [(1, 512, 1536), (7, 64, 40), (33, 130, 24), (5, 13, 21), (100, 48, 17)]


def _case(m: int, k: int, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)


def test_reference_quantizers_round_trip():
    x, w, _ = _case(9, 64, 33)
    wq, ws = quant.quantize_weight(w)
    assert wq.dtype == torch.int8 and wq.abs().max() == 127 and ws.shape == (33,)
    assert (wq.float() * ws[:, None] - w).abs().max() <= ws.max() / 2 + 1e-6  # half a step at most
    xq, xs = quant.quantize_rows(torch.cat([x, torch.zeros(1, 64)]))
    assert xs[-1] == 1 and not xq[-1].any()  # a zero row: scale 1, all zeros


def test_reference_linears_close_to_float():
    x, w, b = _case(8, 256, 64)
    wq, ws = quant.quantize_weight(w)
    want = F.linear(x, w, b)
    for got in (quant.w8a16_ref(x, wq, ws, b), quant.w8a8_ref(x, wq, ws, b), quant.w8i16_ref(x, wq, ws, b)):
        assert (got - want).abs().max() / want.abs().max() < 0.03


@needs_kernel
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_cpu_int8_linears_match_reference(m, k, n):
    x, w, b = _case(m, k, n)
    wq, ws = quant.quantize_weight(w)
    for scheme, ref in (("w8a16", quant.w8a16_ref), ("w8a8", quant.w8a8_ref)):
        for bias in (b, None):
            got = quant_cpu.linear(x, quant_cpu.pack(wq, scheme), scheme, ws, k, n, bias)
            # w8a8 is integer arithmetic up to the final scaling: the same float ops in the same order
            tol = dict(rtol=0, atol=1e-5) if scheme == "w8a8" else dict(rtol=1e-5, atol=1e-4)
            torch.testing.assert_close(got, ref(x, wq, ws, bias), **tol)


@needs_kernel
def test_cpu_row_quantization_is_the_reference():
    x, _, _ = _case(11, 77, 1)
    x[3] = 0
    x[4, 5] = 1e-30
    xq, xs = quant_cpu.quantize_rows(x)
    rq, rs = quant.quantize_rows(x)
    assert torch.equal(xq[:, :77], rq) and torch.equal(xs, rs) and not xq[:, 77:].any()


@needs_kernel
@pytest.mark.parametrize("k", [4, 64, 1408, 4100])
def test_int8_gemm_exact_at_saturation_extremes(k):
    """vpmaddubsw adds pairs of u8 x s8 products with int16 saturation: +-127 everywhere is where a
    kernel that skips the sign trick goes wrong (2 * 127 * 127 fits int16; 2 * 255 * 127 does not)."""
    g = torch.Generator().manual_seed(k)
    n = 24
    xq = torch.tensor([[127] * k, [-127] * k, [127, -127] * (k // 2), [0] * k], dtype=torch.int8)
    xq = torch.cat([xq, torch.randint(-127, 128, (3, k), generator=g, dtype=torch.int8)])
    wq = torch.cat([torch.full((1, k), 127), torch.full((1, k), -127), torch.tensor([[-127, 127] * (k // 2)]),
                    torch.randint(-127, 128, (n - 3, k), generator=g)]).to(torch.int8)
    got = quant_cpu.gemm_i32(xq, quant_cpu.pack(wq, "w8a8"), k, n)
    want = quant.int_matmul_ref(xq, wq)
    assert want.abs().max() == 127 * 127 * k  # the extremes really are there
    assert torch.equal(got, want)


@pytest.fixture(scope="module")
def avx2_core_lib():
    """The same sources built without AVX-512 (so without VNNI): the sign-trick core a CPU without VNNI runs.
    Skipped where this machine's build already is that core (the tests above cover it) or cannot have AVX2."""
    if cpu_kernels.load() is None or quant_cpu.w8a8_core() != "vnni":
        pytest.skip("the loaded build already runs the sign-trick core")
    lib = cpu_kernels.build_variant(cpu_kernels.AVX2_ONLY)
    assert quant_cpu.w8a8_core(lib) == "maddubs"
    return lib


@needs_kernel
@pytest.mark.parametrize("core", ["loaded", "avx2"])
def test_int8_cores_exact_and_match_reference(core, request):
    """Both builds' cores (AVX-512: W8A8 on VNNI with offset activations and packed column sums, W8A16 in
    12 x 16 zmm tiles; AVX2: the sign trick, W8A16 6 x 16 tiles or widened panels): W8A8 exact int32 at the
    +-127 extremes and on odd shapes (K not a multiple of 4 or odd, an odd number of panels, rows over a tile
    and over a row block), and both fused linears equal to the reference."""
    lib = request.getfixturevalue("avx2_core_lib") if core == "avx2" else None
    g = torch.Generator().manual_seed(7)
    for m, k, n in [(1, 4, 1), (1, 576, 200), (3, 13, 17), (9, 1540, 40), (100, 130, 33), (13, 576, 48),
                    (25, 7, 16)]:
        xq = torch.randint(-127, 128, (m, (k + 3) // 4 * 4), generator=g, dtype=torch.int8)
        xq[:, k:] = 0
        xq[0, :k] = 127
        wq = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
        wq[0] = -127
        packed = quant_cpu.pack(wq, "w8a8", lib)
        assert torch.equal(quant_cpu.gemm_i32(xq, packed, k, n, lib), quant.int_matmul_ref(xq[:, :k], wq))
        x, w, b = _case(m, k, n, seed=m)
        wq, ws = quant.quantize_weight(w)
        got = quant_cpu.linear(x, quant_cpu.pack(wq, "w8a8", lib), "w8a8", ws, k, n, b, lib)
        torch.testing.assert_close(got, quant.w8a8_ref(x, wq, ws, b), rtol=0, atol=1e-5)
        got = quant_cpu.linear(x, quant_cpu.pack(wq, "w8a16", lib), "w8a16", ws, k, n, b, lib)
        torch.testing.assert_close(got, quant.w8a16_ref(x, wq, ws, b), rtol=1e-5, atol=1e-4)


@needs_kernel
@pytest.mark.parametrize("core", ["loaded", "avx2"])
def test_w8i16_head_kernel_is_its_reference_bit_for_bit(core, request):
    """The int8 head's kernel (csrc/gemm_w8i16.c: int16 rows, int32 chunk sums of 1,024 k added in fp32):
    the reference's very bits on odd K (a padded pair), several chunks, N off the panel width, rows over a
    tile, with and without bias; and a chunk at the int32 edge (1,024 products of 16383 x 127)."""
    lib = request.getfixturevalue("avx2_core_lib") if core == "avx2" else None
    for m, k, n in [(1, 576, 200), (1, 7, 5), (3, 13, 17), (9, 1540, 40), (6, 2100, 49), (1, 3000, 1536)]:
        x, w, b = _case(m, k, n, seed=k)
        wq, ws = quant.quantize_weight(w)
        packed = quant_cpu.pack(wq, quant.HEAD_SCHEME, lib)
        for bias in (b, None):
            got = quant_cpu.linear(x, packed, quant.HEAD_SCHEME, ws, k, n, bias, lib)
            assert torch.equal(got, quant.w8i16_ref(x, wq, ws, bias)), (m, k, n)
    x, wq = torch.ones(2, 2048), torch.full((16, 2048), 127, dtype=torch.int8)
    x[1] = -1
    got = quant_cpu.linear(x, quant_cpu.pack(wq, quant.HEAD_SCHEME, lib), quant.HEAD_SCHEME, torch.ones(16), 2048,
                           16, None, lib)
    assert torch.equal(got, quant.w8i16_ref(x, wq, torch.ones(16), None))
    assert got[0, 0] == 2 * 1024 * 16383 * 127 / 16383 and got[1, 0] == -got[0, 0]  # no int32 wrap


@needs_kernel
@pytest.mark.parametrize("core", ["loaded", "avx2"])
@pytest.mark.parametrize("n", [200, 1536])  # panels that leave a remainder after the multi-panel groups; none
def test_a_lone_row_is_bit_identical_to_the_same_row_in_a_batch(core, n, request):
    """A one-stream decode row takes the multi-panel single-row path (several panels streamed at once); its
    result must be the very bits it gets inside a batch's tiles (fp32, W8A16, W8A8), so that a request's
    output does not depend on what it is batched with."""
    from npu_ops.linear import _apply, _pack
    lib = request.getfixturevalue("avx2_core_lib") if core == "avx2" else None
    x, w, b = _case(7, 576, n, seed=n)
    wq, ws = quant.quantize_weight(w)
    for scheme in ("w8a16", "w8a8", quant.HEAD_SCHEME):
        packed = quant_cpu.pack(wq, scheme, lib)
        batch = quant_cpu.linear(x, packed, scheme, ws, 576, n, b, lib)
        for r in (0, 6):
            assert torch.equal(quant_cpu.linear(x[r:r + 1], packed, scheme, ws, 576, n, b, lib), batch[r:r + 1])
    if core == "loaded":
        packed = _pack("csrc", w, 32)
        batch = _apply("csrc", x, packed, n, b)
        assert torch.equal(_apply("csrc", x[3:4], packed, n, b), batch[3:4])


@needs_kernel
def test_quant_linear_module_paths_agree():
    x, w, b = _case(6, 96, 40)
    lin = torch.nn.Linear(96, 40)
    with torch.no_grad():
        lin.weight.copy_(w), lin.bias.copy_(b)
    for scheme in (*quant.SCHEMES, quant.HEAD_SCHEME):
        mod = quant.QuantLinear.from_float(lin, scheme)
        want = mod.reference(x)
        assert mod.pack_for_cpu() and mod.path == "cpu-int8"
        torch.testing.assert_close(mod(x), want, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(mod(x.view(2, 3, 96)), want.view(2, 3, 40), rtol=1e-5, atol=1e-4)


def test_w8a8_static_reference_follows_msmodelslim_formula():
    x, w, _ = _case(4, 32, 8)
    wq, _ = quant.quantize_weight(w)
    s, o = torch.tensor([0.05]), torch.tensor([3.0])
    qb, deq = torch.arange(8, dtype=torch.int32), torch.rand(8)
    xq = torch.clamp(torch.round(x / s + o), -128, 127)
    want = ((xq @ wq.float().T) + qb) * deq
    torch.testing.assert_close(quant.w8a8_static_ref(x, wq, s, o, deq, qb), want)


def test_cuda_int_mm_path_matches_reference(monkeypatch):
    """torch._int_mm's contract: int8 [M, K] . int8 [K, N] -> int32 (M > 16, K and N multiples of 8)."""
    calls = []

    def int_mm(a, b):
        assert a.dtype == b.dtype == torch.int8 and a.shape[0] > 16 and a.shape[1] % 8 == 0 and b.shape[1] % 8 == 0
        calls.append(a.shape)
        return quant.int_matmul_ref(a, b.T.contiguous())

    monkeypatch.setattr(torch, "_int_mm", int_mm)
    x, w, b = _case(20, 64, 16)
    wq, ws = quant.quantize_weight(w)
    torch.testing.assert_close(quant._cuda_w8a8(x, wq, ws, b), quant.w8a8_ref(x, wq, ws, b))
    quant._cuda_w8a8(x[:3], wq, ws, b)  # too few rows for _int_mm: the reference
    assert calls == [(20, 64)]


def test_npu_paths_follow_torch_npu_contracts(monkeypatch):
    """Stand-ins that check the documented argument layouts: weight as [K, N], 1-D per-channel scales,
    per-token scales of npu_dynamic_quant."""
    x, w, b = _case(5, 32, 12)
    wq, ws = quant.quantize_weight(w)

    def wqbmm(x_, weight, antiquant_scale, *a, **kw):
        assert weight.shape == (32, 12) and antiquant_scale.shape == (12,)
        return x_ @ (weight.float() * antiquant_scale)

    def dyn(x_):
        q, s = quant.quantize_rows(x_)
        return q, s

    def qmm(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None, output_dtype=None):
        assert x1.dtype == x2.dtype == torch.int8 and x2.shape == (32, 12) and scale.shape == (12,)
        assert pertoken_scale.shape == (5,)
        return (quant.int_matmul_ref(x1, x2.T).float() * scale * pertoken_scale[:, None]).to(output_dtype)

    fake = types.SimpleNamespace(npu_weight_quant_batchmatmul=wqbmm, npu_dynamic_quant=dyn, npu_quant_matmul=qmm)
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    for scheme, ref, tol in (("w8a16", quant.w8a16_ref, 1e-4), ("w8a8", quant.w8a8_ref, 5e-3)):
        mod = quant.QuantLinear(32, 12, scheme, wq, ws, b)
        torch.testing.assert_close(quant._npu_forward(mod, x), ref(x, wq, ws, b), rtol=tol, atol=tol)


# ---------------------------------------------------------------- int8 KV cache
def test_kv_rows_round_trip_and_memory():
    x = torch.randn(7, 4, 64)
    rows = quant_kv.quantize(x)
    assert rows.dtype == torch.int8 and rows.shape == (7, 4, 68)
    back = quant_kv.dequantize(rows, torch.float32)
    assert (back - x).abs().max() <= x.abs().amax() / 127
    model = types.SimpleNamespace(dims=types.SimpleNamespace(layers=8, kv_heads=4, head_dim=64))
    fp32, i8 = kv_bytes_per_block(model, 16, torch.float32), kv_bytes_per_block(model, 16, torch.float32, "int8")
    assert fp32 == 2 * 8 * 16 * 4 * 64 * 4 and i8 == 2 * 8 * 16 * 4 * 68  # 68/256 of fp32: under a third


def _int8_case(batch: int, heads: int, kv_heads: int, d: int, bs: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 4 * bs + 3, (batch,), generator=g)
    max_blocks = int((lens.max() + bs - 1) // bs)
    nb = batch * max_blocks + 3
    kc = quant_kv.quantize(torch.randn(nb, bs, kv_heads, d, generator=g))
    vc = quant_kv.quantize(torch.randn(nb, bs, kv_heads, d, generator=g))
    tables = torch.randperm(nb, generator=g)[:batch * max_blocks].view(batch, max_blocks)
    q = torch.randn(batch, heads, d, generator=g)
    meta = ops.AttentionMetadata(slots=torch.empty(0, dtype=torch.long), num_decode=batch,
                                 decode_block_tables=tables.to(torch.int32), decode_ctx_lens=lens.to(torch.int32),
                                 block_tables=tables.to(torch.int32), row_seq=torch.arange(batch, dtype=torch.int32),
                                 row_pos=(lens - 1).to(torch.int32))
    return q, kc, vc, meta


@needs_kernel
@pytest.mark.parametrize("batch", [1, 3, 40])
@pytest.mark.parametrize("heads,kv_heads,d,bs", [(8, 4, 64, 16), (4, 4, 32, 1), (6, 2, 12, 4), (4, 2, 128, 16)])
def test_int8_attention_kernel_matches_dequantizing_reference(batch, heads, kv_heads, d, bs):
    q, kc, vc, meta = _int8_case(batch, heads, kv_heads, d, bs)
    got = ops.paged_attention(q, None, None, kc, vc, meta, d ** -0.5)  # the kernel: reads int8 pages in place
    want = ops._decode_ref(q, kc, vc, meta, d ** -0.5)  # gathers, dequantizes, SDPA
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("batch", [1, 3])
def test_int8_attention_rows_have_the_same_bits_for_any_task_split(batch):
    """The kernel's tasks follow the rows and the threads (attention.c's plan): with 1, 2 and 3 threads one decode
    row goes to tasks of one query head, then to the team's lone row (attention_lone_i8.c); three rows go to tasks
    of a KV head's query heads (a row widened once for the group), then of one query head. Each score and sum takes
    the same operations in every task, so every split gives the same bits."""
    q, kc, vc, meta = _int8_case(batch, 9, 3, 64, 16, seed=batch)
    threads = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            outs.append(quant_kv.paged_attention_rows(q, kc, vc, meta.block_tables, meta.row_seq, meta.row_pos, 0.125))
    finally:
        torch.set_num_threads(threads)
    assert int(meta.row_pos.max()) >= 32  # over several blocks of 16
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_write_kv_quantizes_into_an_int8_cache():
    kc = torch.zeros(4, 2, 2, 36, dtype=torch.int8)
    vc = torch.zeros_like(kc)
    k, v = torch.randn(3, 2, 32), torch.randn(3, 2, 32)
    ops.write_kv(kc, vc, k, v, torch.tensor([0, 5, 7]))
    got = quant_kv.dequantize(kc.view(-1, 2, 36)[torch.tensor([0, 5, 7])], torch.float32)
    assert (got - k).abs().max() <= k.abs().max() / 127
    assert not kc.view(-1, 2, 36)[1].any()  # other slots untouched


def test_config_keys_are_checked():
    with pytest.raises(ValueError, match="quantization"):
        EngineConfig(model="m", quantization="int4").validate()
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(model="m", kv_cache_dtype="fp8").validate()
    EngineConfig(model="m", quantization="w8a8", kv_cache_dtype="int8").validate()


def test_config_json_keys_reach_the_engine(tmp_path):
    import copy
    import json
    from pathlib import Path

    from mindie_service.config.loading import load_config
    base = json.loads((Path(__file__).resolve().parents[2] / "conf" / "config.json").read_text())

    def engine(**model_keys):
        c = copy.deepcopy(base)
        c["BackendConfig"]["ModelDeployConfig"]["ModelConfig"][0].update(model_keys)
        (tmp_path / "c.json").write_text(json.dumps(c))
        return load_config(tmp_path / "c.json").engine_config()

    assert (engine().quantization, engine().kv_cache_dtype) == (None, "auto")
    e = engine(quantization="w8a16", kvCacheDtype="int8")
    assert (e.quantization, e.kv_cache_dtype) == ("w8a16", "int8")
    with pytest.raises(Exception, match="quantization must be one of"):
        engine(quantization="int4")

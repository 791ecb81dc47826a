"""The CPU fast paths: the C paged-attention and elementwise kernels and oneDNN-packed linears, each held
against the portable PyTorch reference, and the fallbacks when they cannot be had."""
from __future__ import annotations

import logging
import os
import shutil
import sys

import pytest
import torch
import torch.nn.functional as F

from npu_ops import cpu_kernels, ops
from npu_ops.linear import FastLinear, onednn_linear_available, pack_linears

# Skipped only where the kernels cannot be had by design: no C compiler (what cpu_kernels.load looks for), or
# switched off on purpose. Anywhere else a failed build must fail these tests, not turn them into skips.
HAS_CC = bool(os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc"))
KERNELS_WANTED = HAS_CC and not cpu_kernels.switched_off()
needs_kernel = pytest.mark.skipif(not KERNELS_WANTED, reason="no C compiler, or MINDIE_CPU_KERNELS=0")


@needs_kernel
def test_kernels_build_and_load_where_a_c_compiler_exists():
    assert cpu_kernels.load() is not None, cpu_kernels.describe()
    assert cpu_kernels.describe().startswith("CPU kernels: on")


def _decode(q, k_cache, v_cache, tables, ctx_lens, scale):
    """One query row per sequence, at its last position."""
    rows = torch.arange(q.shape[0], dtype=torch.int32)
    return cpu_kernels.paged_attention_rows(q, k_cache, v_cache, tables, rows, ctx_lens.to(torch.int32) - 1, scale)


def _decode_case(batch: int, heads: int, kv_heads: int, d: int, bs: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 5 * bs + 3, (batch,), generator=g)
    max_blocks = int((lens.max() + bs - 1) // bs)
    num_blocks = batch * max_blocks + 5
    k_cache = torch.randn(num_blocks, bs, kv_heads, d, generator=g)
    v_cache = torch.randn(num_blocks, bs, kv_heads, d, generator=g)
    # Scattered, non-overlapping block tables; padding entries point at block 0 (never read: past ctx_len).
    tables = torch.randperm(num_blocks, generator=g)[:batch * max_blocks].view(batch, max_blocks)
    q = torch.randn(batch, heads, d, generator=g)
    pos = torch.arange(max_blocks * bs)
    meta = ops.AttentionMetadata(slots=torch.empty(0, dtype=torch.long), num_decode=batch,
                                 decode_block_gather=tables, decode_mask=(pos[None] < lens[:, None])[:, None, None, :],
                                 decode_block_tables=tables.to(torch.int32), decode_ctx_lens=lens.to(torch.int32))
    return q, k_cache, v_cache, meta


@needs_kernel
@pytest.mark.parametrize("batch", [1, 3, 40])  # few sequences split KV heads across tasks; many do not
@pytest.mark.parametrize("heads,kv_heads,d,bs", [(8, 4, 64, 16), (4, 4, 32, 1), (8, 1, 16, 128), (6, 2, 8, 4),
                                                 (4, 2, 128, 16), (3, 3, 12, 8)])
def test_decode_kernel_matches_reference(batch, heads, kv_heads, d, bs):
    q, kc, vc, meta = _decode_case(batch, heads, kv_heads, d, bs)
    got = _decode(q, kc, vc, meta.decode_block_tables, meta.decode_ctx_lens, d ** -0.5)
    want = ops._decode_ref(q, kc, vc, meta, d ** -0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("heads,kv_heads,d,bs", [(9, 3, 64, 16), (8, 2, 12, 4), (4, 4, 128, 8), (3, 3, 64, 16),
                                                 (10, 5, 64, 8), (12, 3, 64, 4), (16, 2, 64, 16)])
def test_a_lone_decode_row_has_the_bits_it_has_in_a_batch(heads, kv_heads, d, bs):
    """A lone row (one-stream decode) is shared by the whole team by key blocks, heads and output columns (by KV
    head and column chunk for groups of up to 4 query heads, several heads a pass, or a chunk at a time where a
    thread's share ends inside a pass); every element must still come out as in a batch's per-head tasks (64-wide
    and odd head sizes, groups of 1 to 8)."""
    q, kc, vc, meta = _decode_case(6, heads, kv_heads, d, bs, seed=heads)
    lens = meta.decode_ctx_lens
    batch = _decode(q, kc, vc, meta.decode_block_tables, lens, d ** -0.5)
    longest = int(lens.argmax())
    assert lens[longest] > 2 * bs  # a row over several blocks
    for r in {0, longest, 5}:
        lone = cpu_kernels.paged_attention_rows(q[r:r + 1], kc, vc, meta.decode_block_tables,
                                                torch.tensor([r], dtype=torch.int32), lens[r:r + 1] - 1, d ** -0.5)
        assert torch.equal(lone, batch[r:r + 1])


@needs_kernel
def test_row_kernel_is_what_cpu_paged_attention_runs(monkeypatch):
    q, kc, vc, meta = _decode_case(5, 8, 4, 16, 16)
    meta.block_tables, meta.row_seq = meta.decode_block_tables, torch.arange(5, dtype=torch.int32)
    meta.row_pos = meta.decode_ctx_lens - 1
    calls = []
    real = cpu_kernels.paged_attention_rows
    monkeypatch.setattr(cpu_kernels, "paged_attention_rows", lambda *a: calls.append(1) or real(*a))
    out = ops.paged_attention(q, q[:, :4], q[:, :4], kc, vc, meta, 0.25)
    assert calls == [1]
    torch.testing.assert_close(out, ops.paged_attention_ref(q, q[:, :4], q[:, :4], kc, vc, meta, 0.25),
                               rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("bs", [1, 4, 16])
def test_row_kernel_runs_a_mixed_step_like_the_reference(bs):
    """Decodes, a fresh prefill longer than a tile, and a prefill after a cached prefix, in one call."""
    g = torch.Generator().manual_seed(bs)
    heads, kv_heads, d = 8, 2, 64
    ctx_lens, new = [37, 3, 1, 29, 21], [1, 1, 1, 29, 9]  # three decodes, then two prefills
    nb = [(c + bs - 1) // bs for c in ctx_lens]
    num_blocks = sum(nb) + 4
    k_cache, v_cache = torch.randn(num_blocks, bs, kv_heads, d, generator=g), torch.randn(num_blocks, bs, kv_heads, d,
                                                                                          generator=g)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables, i = [], 0
    for n in nb:
        tables.append(perm[i:i + n])
        i += n
    width = max(nb)
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    slot = lambda t, p: t[p // bs] * bs + p % bs  # noqa: E731
    rows = [(s, p) for s, (c, n) in enumerate(zip(ctx_lens, new)) for p in range(c - n, c)]
    q = torch.randn(len(rows), heads, d, generator=g)
    k = k_cache.view(-1, kv_heads, d)[[slot(tables[s], p) for s, p in rows]]
    v = v_cache.view(-1, kv_heads, d)[[slot(tables[s], p) for s, p in rows]]
    spans, start = [], 3
    for s in (3, 4):
        c, n = ctx_lens[s], new[s]
        prefix = None if n == c else torch.tensor([slot(tables[s], p) for p in range(c)])
        spans.append(ops.PrefillSpan(start, n, c, prefix))
        start += n
    meta = ops.AttentionMetadata(slots=torch.tensor([slot(tables[s], p) for s, p in rows]), num_decode=3,
                                 prefills=spans, decode_block_tables=bt[:3],
                                 decode_ctx_lens=torch.tensor(ctx_lens[:3], dtype=torch.int32), block_tables=bt,
                                 row_seq=torch.tensor([s for s, _ in rows], dtype=torch.int32),
                                 row_pos=torch.tensor([p for _, p in rows], dtype=torch.int32))
    got = ops.paged_attention(q, k, v, k_cache, v_cache, meta, d ** -0.5)
    torch.testing.assert_close(got, ops.paged_attention_ref(q, k, v, k_cache, v_cache, meta, d ** -0.5),
                               rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("bad_len", [0, 10_000])
def test_decode_kernel_refuses_lengths_outside_the_block_table(bad_len):
    q, kc, vc, meta = _decode_case(4, 8, 4, 16, 16)
    lens = meta.decode_ctx_lens.clone()
    lens[2] = bad_len
    with pytest.raises(RuntimeError, match="bad shapes, rows or positions"):
        _decode(q, kc, vc, meta.decode_block_tables, lens, 0.25)


@needs_kernel
def test_decode_kernel_is_built_once_per_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("MINDIE_KERNEL_CACHE", str(tmp_path))
    cc = cpu_kernels.shutil.which("cc") or cpu_kernels.shutil.which("gcc")
    first = cpu_kernels._build(cc)
    stamp = first.stat().st_mtime_ns
    assert cpu_kernels._build(cc) == first and first.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no leftover temporary build folder


@needs_kernel
def test_kernels_are_built_in_the_temp_folder_when_home_is_unusable(tmp_path, monkeypatch):
    blocker = tmp_path / "home"
    blocker.write_text("a file where the home folder should be: no cache folder can be made under it")
    monkeypatch.delenv("MINDIE_KERNEL_CACHE", raising=False)
    monkeypatch.setattr(cpu_kernels.Path, "home", lambda: blocker)
    monkeypatch.setattr(cpu_kernels.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    built = cpu_kernels._build(cpu_kernels.shutil.which("cc") or cpu_kernels.shutil.which("gcc"))
    assert built.parent.parent == tmp_path / "tmp" and built.exists()


def test_without_a_compiler_the_reference_path_is_used(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MINDIE_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "/bin/false")
    cpu_kernels.load.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="npu_ops.cpu_kernels"):
            assert cpu_kernels.load() is None
        assert "PyTorch reference path" in caplog.text and "PyTorch reference path" in cpu_kernels.describe()
        q, kc, vc, meta = _decode_case(3, 8, 4, 16, 16)
        assert not cpu_kernels.supports(q, kc)
        out = ops.paged_attention(q, q[:, :4], q[:, :4], kc, vc, meta, 0.25)
        torch.testing.assert_close(out, ops.paged_attention_ref(q, q[:, :4], q[:, :4], kc, vc, meta, 0.25))
    finally:
        monkeypatch.undo()
        cpu_kernels.load.cache_clear()


def test_kernels_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("MINDIE_CPU_KERNELS", "0")
    cpu_kernels.load.cache_clear()
    try:
        assert cpu_kernels.load() is None
    finally:
        monkeypatch.undo()
        cpu_kernels.load.cache_clear()



@pytest.fixture
def configured(monkeypatch):
    """configure() as the engine calls it, with the environment's overrides cleared; defaults restored after."""
    monkeypatch.delenv("MINDIE_CPU_KERNELS", raising=False)
    monkeypatch.delenv("MINDIE_KERNEL_CACHE", raising=False)
    yield cpu_kernels.configure
    cpu_kernels.configure()
    monkeypatch.undo()
    cpu_kernels.load.cache_clear()


def test_configure_off_switches_every_cpu_fast_path_off(configured):
    configured(enabled=False)
    assert cpu_kernels.switched_off() and cpu_kernels.load() is None
    assert "cpu_kernels: false" in cpu_kernels.describe()
    q, kc, vc, meta = _decode_case(3, 8, 4, 16, 16)
    assert not cpu_kernels.supports(q, kc)
    lin = FastLinear(16, 8)
    assert pack_linears(torch.nn.Sequential(lin), 8) == 0 and lin.packed is None
    configured(enabled=True)
    assert not cpu_kernels.switched_off()


def test_environment_overrides_configure(configured, monkeypatch, tmp_path):
    configured(enabled=False, cache_dir=str(tmp_path / "from-config"))
    monkeypatch.setenv("MINDIE_CPU_KERNELS", "1")
    monkeypatch.setenv("MINDIE_KERNEL_CACHE", str(tmp_path / "from-env"))
    assert cpu_kernels.settings() == cpu_kernels.KernelSettings(True, str(tmp_path / "from-env"))
    configured(enabled=True)
    monkeypatch.setenv("MINDIE_CPU_KERNELS", "0")
    assert cpu_kernels.switched_off() and "MINDIE_CPU_KERNELS=0" in cpu_kernels.settings().why_off


@needs_kernel
def test_configure_cache_dir_builds_into_that_folder(configured, tmp_path):
    configured(cache_dir=str(tmp_path / "kernels"))
    lib = cpu_kernels.load()
    assert lib is not None
    built = list((tmp_path / "kernels").iterdir())
    assert len(built) == 1 and built[0].name.startswith("cpu_kernels-") and built[0].suffix == ".so"
    assert built[0].name in cpu_kernels.describe()


@needs_kernel
def test_weights_packed_before_a_switch_off_keep_working(configured):
    torch.manual_seed(0)
    lin = FastLinear(32, 24)
    x = torch.randn(5, 32)
    want = F.linear(x, lin.weight, lin.bias)
    assert lin.pack(batch_hint=8, keep_dense=False) and lin.packed_kind == "csrc"
    configured(enabled=False)  # e.g. a second engine in this process with cpu_kernels: false
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- fused elementwise ops
@needs_kernel
@pytest.mark.parametrize("rows,dim", [(1, 8), (5, 100), (300, 512)])  # single-threaded and shared-out sizes
def test_rms_norm_kernel_matches_reference(rows, dim):
    torch.manual_seed(rows)
    x, w = torch.randn(rows, dim) * 3, torch.rand(dim) + 0.5
    got = ops.rms_norm(x, w, 1e-6)
    torch.testing.assert_close(got, ops.rms_norm_ref(x, w, 1e-6), rtol=1e-6, atol=1e-6)
    assert torch.equal(got, cpu_kernels.rms_norm(x, w, 1e-6))


@needs_kernel
@pytest.mark.parametrize("rows", [1, 37, 700])
def test_rotary_kernel_reads_heads_out_of_the_packed_qkv_rows(rows):
    torch.manual_seed(rows)
    heads, kv_heads, d = 4, 2, 16
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * d)
    ang = torch.rand(rows, d // 2) * 6
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    q, k, _ = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    for part, n in ((q, heads), (k, kv_heads)):
        x = part.view(rows, n, d)  # strided: rows are qkv rows
        got = ops.rotary(x, cos, sin)
        assert got.is_contiguous() and got.shape == (rows, n, d)
        assert torch.equal(got, ops.rotary_ref(x, cos, sin))  # same operations, same roundings


@needs_kernel
@pytest.mark.parametrize("rows,inter", [(3, 5), (16, 1408), (200, 13)])  # widths off the 8-lane vector too
def test_silu_mul_kernel_matches_reference(rows, inter):
    torch.manual_seed(inter)
    gu = torch.randn(rows, 2 * inter) * 6
    gu[0, :min(inter, 4)] = torch.tensor([-120.0, -88.0, 90.0, 0.0])[:min(inter, 4)]  # exp's clamps
    got = ops.silu_mul(gu)
    torch.testing.assert_close(got, ops.silu_mul_ref(gu), rtol=1e-6, atol=1e-6)
    assert torch.isfinite(got).all()


# ---------------------------------------------------------------- packed linears
KINDS = (["csrc"] if KERNELS_WANTED else []) + (["onednn"] if onednn_linear_available() else [])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 5, 6, 7, 97, 200])  # around the 6-row tile and the 96-row chunk
@pytest.mark.parametrize("out_features", [16, 40, 1000])  # whole panels of 16 and a partial last one
def test_each_packed_gemm_matches_f_linear(kind, bias, rows, out_features):
    from npu_ops.linear import _apply, _pack

    g = torch.Generator().manual_seed(rows + out_features)
    w, x = torch.randn(out_features, 72, generator=g), torch.randn(rows, 72, generator=g)
    b = torch.randn(out_features, generator=g) if bias else None
    got = _apply(kind, x, _pack(kind, w, 32), out_features, b)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(not KINDS, reason="no packed GEMM in this build")
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 64, 1000])
def test_packed_linear_matches_f_linear(bias, rows):
    torch.manual_seed(0)
    lin = FastLinear(96, 40, bias=bias)
    assert lin.pack(batch_hint=32) and lin.packed_kind == KINDS[0]
    x = torch.randn(rows, 96)
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
        y = lin(x.view(1, rows, 96))  # any leading shape
    assert y.shape == (1, rows, 40)


@pytest.mark.skipif(not KINDS, reason="no packed GEMM in this build")
def test_packing_can_free_the_dense_weight():
    torch.manual_seed(0)
    lin = FastLinear(32, 24)
    x = torch.randn(5, 32)
    want = F.linear(x, lin.weight, lin.bias)
    assert lin.pack(batch_hint=8, keep_dense=False) and lin.weight is None
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), want, rtol=1e-5, atol=1e-5)
        with pytest.raises(RuntimeError, match="packed for fp32 on the CPU"):
            lin(x.double())


def test_linear_is_left_unpacked_off_fp32_cpu():
    lin = FastLinear(16, 8).to(torch.bfloat16)
    assert not lin.pack(batch_hint=8) and lin.packed is None
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias))


# ---------------------------------------------------------------- KV pool memory
def test_kv_pool_is_zeroed_contiguous_per_layer_and_one_allocation(tiny_model):
    from mindie_service import LLM
    from npu_ops import memory

    t = memory.zeros((3, 5 << 18), torch.float32, torch.device("cpu"))  # 15 MiB: spans whole huge pages
    assert t.shape == (3, 5 << 18) and not t.any()
    if sys.platform.startswith("linux"):  # a mapping of its own from a huge page's start, not reused heap (below
        assert t.data_ptr() % (2 << 20) == 0  # glibc's mmap threshold, on 4 KiB pages already)
    runner = LLM(str(tiny_model), num_kv_blocks=64).engine.runner
    base = runner.kv_caches[0][0].untyped_storage().data_ptr()
    for k, v in runner.kv_caches:  # the kernels need each layer's K and V contiguous
        assert k.is_contiguous() and v.is_contiguous() and not k.any() and not v.any()
        assert k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr() == base


# ---------------------------------------------------------------- the portable (non-AVX2) C paths
@needs_kernel
@pytest.mark.skipif(cpu_kernels.platform.machine() not in ("x86_64", "AMD64"), reason="baseline x86-64 build")
def test_kernels_built_without_avx2_match_the_references(tmp_path, monkeypatch):
    """CPUs without AVX2 get the plain-C tiles and loops: build that variant here and hold it to the references."""
    from npu_ops.linear import _apply, _pack

    monkeypatch.setenv("MINDIE_KERNEL_CACHE", str(tmp_path))
    flags = [f for f in cpu_kernels.FLAGS if not f.startswith("-march")] + ["-march=x86-64"]
    cc = cpu_kernels.shutil.which("cc") or cpu_kernels.shutil.which("gcc")
    lib = cpu_kernels._declare(cpu_kernels.ctypes.CDLL(str(cpu_kernels._build(cc, flags))))
    monkeypatch.setattr(cpu_kernels, "load", lambda: lib)
    g = torch.Generator().manual_seed(7)
    w, x, b = torch.randn(40, 72, generator=g), torch.randn(13, 72, generator=g), torch.randn(40, generator=g)
    torch.testing.assert_close(_apply("csrc", x, _pack("csrc", w, 8), 40, b), F.linear(x, w, b), rtol=1e-5, atol=1e-4)
    gu, h = torch.randn(9, 2 * 21, generator=g) * 5, torch.randn(9, 100, generator=g)
    torch.testing.assert_close(ops.silu_mul(gu), ops.silu_mul_ref(gu), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ops.rms_norm(h, h[0].abs() + 0.5, 1e-6), ops.rms_norm_ref(h, h[0].abs() + 0.5, 1e-6))
    from npu_ops import quant, quant_cpu
    wq, ws = quant.quantize_weight(w)
    for rows in (x, x[:1]):  # the int8 head's plain loops: its reference's bits, a batch and a lone row
        got = quant_cpu.linear(rows, quant_cpu.pack(wq, "w8i16", lib), "w8i16", ws, 72, 40, b, lib)
        assert torch.equal(got, quant.w8i16_ref(rows, wq, ws, b))
    for d in (64, 12):  # attention's vector-shaped loops and its odd-size ones
        q, kc, vc, meta = _decode_case(6, 4, 2, d, 4)
        torch.testing.assert_close(_decode(q, kc, vc, meta.decode_block_tables, meta.decode_ctx_lens, 0.3),
                                   ops._decode_ref(q, kc, vc, meta, 0.3), rtol=1e-5, atol=1e-5)

"""The NPU path against the documented contracts of torch_npu's ATB ops, before it ever meets an NPU.

``AtbStandIn`` plays torch_npu: its ``_npu_reshape_and_cache`` and ``_npu_paged_attention`` check what
op-plugin 7.0 and ATB's ReshapeAndCache / PagedAttention operations require (fp16/bf16 tensors,
cacheBlockSize % 16 == 0, head size <= 256, int32 block tables and slots on the device, int32 context
lengths on the host, as vllm-ascend passes ``seq_lens``) and compute with the reference. On a host with an
NPU the same tests run on the real ops (``npu`` parameter) with the same tolerance."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from npu_ops import device as npu_device
from npu_ops import ops, platform

ROOT = Path(__file__).resolve().parents[2]


def _has_npu() -> bool:
    try:
        import torch_npu  # noqa: F401
    except Exception:  # noqa: BLE001 - absent or unusable: no NPU case
        return False
    return bool(getattr(torch, "npu", None) and torch.npu.is_available())


TARGETS = ["standin"] + (["npu"] if _has_npu() else [])


class AtbStandIn:
    """torch_npu's two ATB entry points, checking their input contracts; results from the reference."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    @staticmethod
    def _half(*ts: torch.Tensor) -> None:
        dt = {t.dtype for t in ts}
        assert len(dt) == 1 and dt <= {torch.float16, torch.bfloat16}, f"ATB takes fp16/bf16 only, got {dt}"

    @staticmethod
    def _cache_shape(cache: torch.Tensor) -> None:
        bs, hd = cache.shape[1], cache.shape[3]
        assert bs % 16 == 0, f"block size {bs} is not a multiple of 16"
        assert 0 < hd <= 256 and bs * hd <= 128 * 128, f"head size {hd} with block size {bs}"

    def _npu_reshape_and_cache(self, *, key, value, key_cache, value_cache, slot_indices) -> None:
        self.calls.append("reshape_and_cache")
        self._half(key, value, key_cache, value_cache)
        self._cache_shape(key_cache)
        assert slot_indices.dtype == torch.int32 and slot_indices.device == key.device == key_cache.device
        ops.write_kv_ref(key_cache, value_cache, key, value, slot_indices.long())

    def _npu_paged_attention(self, *, query, key_cache, value_cache, num_kv_heads, num_heads, scale_value,
                             block_table, context_lens, out) -> None:
        self.calls.append("paged_attention")
        self._half(query, key_cache, value_cache, out)
        self._cache_shape(key_cache)
        assert block_table.dtype == torch.int32 and block_table.device == query.device, block_table
        assert context_lens.dtype == torch.int32 and context_lens.device.type == "cpu", context_lens.device
        assert num_heads == query.shape[1] and num_kv_heads == key_cache.shape[2] and num_heads % num_kv_heads == 0
        meta = ops.AttentionMetadata(slots=torch.empty(0, dtype=torch.long), num_decode=query.shape[0],
                                     decode_block_tables=block_table, decode_ctx_lens=context_lens.to(query.device))
        out.copy_(ops._decode_ref(query.float(), key_cache.float(), value_cache.float(), meta, scale_value))


@pytest.fixture
def target(request, monkeypatch):
    """(device, stand-in or None): the stand-in is installed as torch_npu and every tensor counts as on an NPU."""
    if request.param == "npu":
        return torch.device("npu:0"), None
    standin = AtbStandIn()
    monkeypatch.setattr(ops, "_torch_npu", lambda: standin)
    monkeypatch.setattr(ops, "_on_npu", lambda t: True)
    monkeypatch.setattr(ops, "atb_status", lambda: (True, "stand-in"))
    return torch.device("cpu"), standin


def _decode_case(dtype: torch.dtype, bs: int, dev: torch.device, heads: int = 8, kv_heads: int = 2, d: int = 64,
                 seed: int = 0):
    """Three sequences decoding one token each over scattered blocks; K/V written through ops.write_kv."""
    g = torch.Generator().manual_seed(seed)
    lens = [bs * 2 + 3, 1, bs + 1]
    nblocks = [(n + bs - 1) // bs for n in lens]
    perm = torch.randperm(sum(nblocks) + 3, generator=g).tolist()
    tables, i = [], 0
    for n in nblocks:
        tables.append(perm[i:i + n])
        i += n
    width = max(nblocks)
    k_cache = torch.zeros(len(perm), bs, kv_heads, d, dtype=dtype, device=dev)
    v_cache = torch.zeros_like(k_cache)
    slots = [t[p // bs] * bs + p % bs for t, n in zip(tables, lens) for p in range(n)]
    k = torch.randn(len(slots), kv_heads, d, generator=g).to(dtype).to(dev)
    v = torch.randn(len(slots), kv_heads, d, generator=g).to(dtype).to(dev)
    ops.write_kv(k_cache, v_cache, k, v, torch.tensor(slots, device=dev))
    q = torch.randn(len(lens), heads, d, generator=g).to(dtype).to(dev)
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=dev)
    host = torch.tensor(lens, dtype=torch.int32)
    return q, k_cache, v_cache, bt, host


def _reference(q, k_cache, v_cache, bt, host, scale):
    meta = ops.AttentionMetadata(slots=torch.empty(0, dtype=torch.long), num_decode=q.shape[0],
                                 decode_block_tables=bt.cpu(), decode_ctx_lens=host)
    return ops._decode_ref(q.float().cpu(), k_cache.float().cpu(), v_cache.float().cpu(), meta, scale)


@pytest.mark.parametrize("target", TARGETS, indirect=True)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bs", [16, 128])
def test_npu_decode_takes_host_int32_lengths_and_matches_the_reference(target, dtype, bs):
    dev, standin = target
    q, kc, vc, bt, host = _decode_case(dtype, bs, dev)
    # The device copy of the lengths is deliberately somewhere ATB cannot read it from: the host copy must be used.
    device_lens = host.to("meta") if standin is not None else host.to(dev)
    meta = ops.AttentionMetadata(slots=torch.empty(0, dtype=torch.long, device=dev), num_decode=q.shape[0],
                                 decode_block_tables=bt, decode_ctx_lens=device_lens, decode_ctx_lens_host=host)
    got = ops.paged_attention(q, q[:, :2], q[:, :2], kc, vc, meta, 0.125)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float().cpu(), _reference(q, kc, vc, bt, host, 0.125), rtol=1e-2, atol=1e-2)
    if standin is not None:
        assert standin.calls == ["reshape_and_cache", "paged_attention"]


@pytest.mark.parametrize("target", ["standin"], indirect=True)
@pytest.mark.parametrize("dtype,bs,d,why", [(torch.float32, 16, 64, "dtype torch.float32"),
                                            (torch.float16, 8, 64, "cacheBlockSize 8"),
                                            (torch.bfloat16, 16, 320, "head size 320"),
                                            (torch.float16, 128, 256, "head size 256 with cacheBlockSize 128")])
def test_caches_atb_cannot_take_run_the_reference_on_the_npu(target, dtype, bs, d, why, caplog):
    dev, standin = target
    ops._note_fallback.cache_clear()
    with caplog.at_level(logging.WARNING, logger="npu_ops.ops"):
        q, kc, vc, bt, host = _decode_case(dtype, bs, dev, d=d)
        meta = ops.AttentionMetadata(slots=torch.empty(0, dtype=torch.long), num_decode=q.shape[0],
                                     decode_block_tables=bt, decode_ctx_lens=host, decode_ctx_lens_host=host)
        got = ops.paged_attention(q, q[:, :2], q[:, :2], kc, vc, meta, d ** -0.5)
    assert standin.calls == []  # neither ATB op was handed what it cannot take
    torch.testing.assert_close(got.float(), _reference(q, kc, vc, bt, host, d ** -0.5), rtol=1e-2, atol=1e-2)
    assert why in caplog.text and "reference path" in caplog.text


@pytest.mark.parametrize("target", ["standin"], indirect=True)
def test_missing_nnal_keeps_the_npu_on_the_reference_path(target, monkeypatch):
    _, standin = target
    monkeypatch.setattr(ops, "atb_status", lambda: (False, "ATB (NNAL) not found"))
    q, kc, vc, bt, host = _decode_case(torch.bfloat16, 16, torch.device("cpu"))
    meta = ops.AttentionMetadata(slots=torch.empty(0, dtype=torch.long), num_decode=q.shape[0],
                                 decode_block_tables=bt, decode_ctx_lens=host, decode_ctx_lens_host=host)
    got = ops.paged_attention(q, q[:, :2], q[:, :2], kc, vc, meta, 0.125)
    assert standin.calls == []
    torch.testing.assert_close(got.float(), _reference(q, kc, vc, bt, host, 0.125), rtol=1e-2, atol=1e-2)


def test_the_runner_hands_attention_host_int32_lengths(tiny_model, monkeypatch):
    """Every decode step's metadata carries the lengths as an int32 host tensor equal to the device copy (the
    per-op path a device runs: the CPU's fused layers, which never reach a device, are switched off here)."""
    from mindie_service import LLM, SamplingParams
    from mindie_service.models import fused_layers, llama

    monkeypatch.setattr(fused_layers, "_enabled", False)

    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    real = llama.paged_attention

    def spy(q, k, v, kc, vc, meta, scale):
        if meta.num_decode:
            seen.append((meta.decode_ctx_lens_host, meta.decode_ctx_lens))
        return real(q, k, v, kc, vc, meta, scale)

    monkeypatch.setattr(llama, "paged_attention", spy)
    # eager steps: a CUDA graph's replay reads its own static buffers, and ATB (the reader of host lengths) runs on
    # an NPU, which takes no graphs
    llm = LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=64, cuda_graphs=False)
    llm.generate(["a b c", "river stone"], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True),
                 use_tqdm=False)
    assert seen
    for host, dev_lens in seen:
        assert host is not None and host.dtype == torch.int32 and host.device.type == "cpu"
        assert host.tolist() == dev_lens.tolist()


# -- device choice ------------------------------------------------------------------------------------
def _fake_npu(monkeypatch, soc: str, atb: tuple[bool, str]) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    fake = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1, get_device_name=lambda i=0: soc)
    monkeypatch.setattr(torch, "npu", fake, raising=False)
    monkeypatch.setattr(npu_device, "atb_status", lambda: atb)


@pytest.mark.parametrize("soc", ["Ascend310P3", "Ascend910A", "Ascend910ProB"])
def test_310p_and_910a_are_refused_naming_what_is_supported(monkeypatch, soc):
    _fake_npu(monkeypatch, soc, (True, "stand-in"))
    with pytest.raises(ValueError, match=rf"{soc} is not supported.*Ascend910B\*"):
        npu_device.select_device("npu")
    info = npu_device.select_device()  # automatic choice: falls back, saying why
    assert info.type != "npu" and f"{soc} is not supported" in info.reason and "NZ" in info.reason


@pytest.mark.parametrize("soc", ["Ascend910B3", "Ascend910_9382"])
def test_a2_and_a3_are_chosen_and_a_missing_nnal_is_named(monkeypatch, soc):
    _fake_npu(monkeypatch, soc, (False, "ATB (NNAL) not found: source nnal/atb/set_env.sh"))
    info = npu_device.select_device()
    assert info.type == "npu" and soc in info.reason and "NNAL" in info.reason and "reference path" in info.reason


def test_atb_probe_looks_in_atb_home_path_then_the_loader_path(monkeypatch, tmp_path):
    """libatb.so from $ATB_HOME_PATH/lib (what NNAL's set_env.sh exports), else through the loader's path; a
    missing one is reported naming NNAL. The loader is a stand-in, so this runs the same on an NPU host."""
    present: set[str] = set()
    tried: list[str] = []

    def fake_cdll(name: str) -> object:
        tried.append(name)
        if name not in present:
            raise OSError(f"{name}: cannot open shared object file")
        return object()

    monkeypatch.setattr(npu_device.ctypes, "CDLL", fake_cdll)
    monkeypatch.setenv("ATB_HOME_PATH", str(tmp_path))
    home_lib = str(tmp_path / "lib" / "libatb.so")
    try:
        for libs, want in [(set(), False), ({"libatb.so"}, True), ({home_lib}, True)]:
            npu_device.atb_status.cache_clear()
            present.clear()
            present.update(libs)
            tried.clear()
            found, why = npu_device.atb_status()
            assert found is want and tried[0] == home_lib
            assert ("NNAL" in why) if not want else why == f"ATB from {tried[-1]}"
    finally:
        npu_device.atb_status.cache_clear()


def test_auto_dtype_on_an_npu_is_half_precision():
    npu = types.SimpleNamespace(type="npu", index=0)
    assert platform.default_dtype(npu, "float32") == "bfloat16"
    assert platform.default_dtype(npu, "float16") == "float16"
    assert platform.default_dtype(npu, "bfloat16") == "bfloat16"


# -- torch-npu's auto-load -------------------------------------------------------------------------------
def test_importing_the_package_first_keeps_a_broken_backend_from_breaking_import_torch(tmp_path):
    """A stand-in for torch-npu without CANN: a ``torch.backends`` entry point whose import raises. Plain
    ``import torch`` fails on it; after ``import mindie_service`` (which every entry, the CLI included,
    imports first) it does not."""
    (tmp_path / "broken_npu.py").write_text("raise ImportError('libascendcl.so: cannot open shared object file')\n")
    dist = tmp_path / "broken_npu-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-npu\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[torch.backends]\ndevice_backend = broken_npu:load\n")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])

    def run(code: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)

    bare = run("import torch")
    assert bare.returncode != 0 and "TORCH_DEVICE_BACKEND_AUTOLOAD" in bare.stderr  # the stand-in bites
    ok = run("import mindie_service, torch, os; print(os.environ['TORCH_DEVICE_BACKEND_AUTOLOAD'])")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "0"

"""npu_ops.platform: the KV-cache budget per device (NPU and CUDA memory queries faked), host memory,
staging, dtype and thread settings."""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from npu_ops import platform

GIB = 1 << 30


@dataclass(frozen=True)
class FakeDevice:
    """Stands in for torch.device("npu:0"), which plain torch cannot construct without torch_npu."""

    type: str
    index: int | None = 0


@pytest.fixture
def host_ram(monkeypatch: pytest.MonkeyPatch) -> None:
    """Host RAM says 64 GiB available: any budget taken from it would be 4 GiB (the CPU cap)."""
    monkeypatch.setattr(platform, "_host_memory", lambda: (64 * GIB, 128 * GIB))


def _fake_accelerator(monkeypatch: pytest.MonkeyPatch, name: str, free: int, total: int) -> list:
    calls: list = []
    fake = SimpleNamespace(mem_get_info=lambda index=None: calls.append(index) or (free, total))
    monkeypatch.setattr(torch, name, fake, raising=False)
    return calls


def test_npu_auto_budget_is_80_percent_of_free_npu_memory_not_host_ram(monkeypatch, host_ram):
    calls = _fake_accelerator(monkeypatch, "npu", free=30 * GIB, total=64 * GIB)
    budget = platform.kv_cache_budget(FakeDevice("npu", 1), -1)
    assert budget == int(30 * GIB * 0.8)
    assert calls == [1]  # asked the NPU the engine runs on
    assert platform.memory_info(FakeDevice("npu", 1)) == (30 * GIB, 64 * GIB)


def test_cuda_auto_budget_is_80_percent_of_free_cuda_memory(monkeypatch, host_ram):
    _fake_accelerator(monkeypatch, "cuda", free=10 * GIB, total=80 * GIB)
    assert platform.kv_cache_budget(FakeDevice("cuda", 0), 0) == 8 * GIB


@pytest.mark.parametrize("device", [FakeDevice("npu"), FakeDevice("cuda"), torch.device("cpu")])
def test_a_requested_size_is_taken_exactly_on_every_device(monkeypatch, device):
    def boom(*_: object) -> None:
        raise AssertionError("no memory query when the size is given")

    monkeypatch.setattr(platform, "memory_info", boom)
    assert platform.kv_cache_budget(device, 2.5) == int(2.5 * GIB)


@pytest.mark.parametrize("available,want", [(64 * GIB, 4 * GIB), (8 * GIB, 2 * GIB)])
def test_cpu_auto_budget_is_a_quarter_of_available_ram_capped_at_4_gib(monkeypatch, available, want):
    monkeypatch.setattr(platform, "_host_memory", lambda: (available, 2 * available))
    assert platform.kv_cache_budget(torch.device("cpu"), -1) == want


def test_npu_budget_without_torch_npu_is_a_clear_error(monkeypatch):
    monkeypatch.delattr(torch, "npu", raising=False)
    with pytest.raises(RuntimeError, match="torch_npu"):
        platform.kv_cache_budget(FakeDevice("npu"), -1)


def test_host_memory_is_bounded_by_the_container_limit(monkeypatch):
    monkeypatch.setattr(platform, "_cgroup_limit", lambda: (6 * GIB, 5 * GIB))
    free, total = platform.memory_info(torch.device("cpu"))
    assert total == 6 * GIB and free <= 1 * GIB


def test_cgroup_v1_no_limit_value_is_ignored(tmp_path, monkeypatch):
    limit, usage = tmp_path / "limit", tmp_path / "usage"
    limit.write_text("9223372036854771712\n")
    usage.write_text("1000\n")
    monkeypatch.setattr(platform, "_CGROUP_FILES", ((str(tmp_path / "absent"), str(usage)), (str(limit), str(usage))))
    assert platform._cgroup_limit() is None
    limit.write_text("max\n")
    assert platform._cgroup_limit() is None
    limit.write_text(f"{3 * GIB}\n")
    assert platform._cgroup_limit() == (3 * GIB, 1000)


def test_real_host_memory_is_plausible():
    free, total = platform.memory_info(torch.device("cpu"))
    assert 0 < free <= total


def test_weights_are_staged_in_host_memory_and_dtype_auto_depends_on_the_device():
    assert platform.staging_device(FakeDevice("npu")) == torch.device("cpu")
    assert platform.default_dtype(torch.device("cpu"), "bfloat16") == "float32"
    assert platform.default_dtype(FakeDevice("npu"), "bfloat16") == "bfloat16"
    assert platform.default_dtype(FakeDevice("cuda"), "float32") == "bfloat16"  # as on the NPU
    assert platform.default_dtype(FakeDevice("cuda"), "float16") == "float16"


def test_thread_settings(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    platform.apply_thread_settings(None)
    platform.apply_thread_settings(3)
    assert calls == [3]


def test_fast_path_note_tells_whether_the_cpu_kernels_run(monkeypatch):
    monkeypatch.setattr(platform.cpu_kernels, "describe", lambda: "CPU kernels: off (test); PyTorch reference path")
    assert platform.fast_path_note(torch.device("cpu")) == "; CPU kernels: off (test); PyTorch reference path"
    monkeypatch.setattr(platform.triton_support, "status", {"cuda": (True, "triton 3.9.0"),
                                                             "npu": (False, "triton-ascend not installed")}.get)
    note = platform.fast_path_note(FakeDevice("cuda"))
    assert note.startswith("; Triton kernels: on (triton 3.9.0: paged attention, KV write") and "rotary" in note
    assert platform.fast_path_note(FakeDevice("npu")) == ("; Triton kernels: off (triton-ascend not installed); "
                                                          "PyTorch reference path")


def test_triton_is_what_cuda_runs_where_it_imports_and_never_the_cpu(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    platform.triton_support.status.cache_clear()
    try:
        assert platform.triton_support.status("cuda") == (True, f"triton {platform.triton_support.triton_import()[0]}")
        assert not platform.triton_support.usable("cpu")  # the interpreter only where a test asks for it
        assert not platform.triton_support.usable("npu")  # plain triton has no NPU backend: triton-ascend has
    finally:
        platform.triton_support.status.cache_clear()

"""What differs per device outside the ops: memory queries, the KV-cache budget, where weights are staged,
the dtype a checkpoint runs in, and thread settings. The engine and the loaders ask here instead of naming
a device themselves (only npu_ops names one)."""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from npu_ops import cpu_kernels, triton_support

logger = logging.getLogger(__name__)

GIB = 1 << 30
ACCELERATOR_FRACTION = 0.8  # of free device memory, measured after the weights are loaded
HOST_FRACTION = 0.25  # of available host RAM: the CPU pool shares it with activations and everything else
HOST_CAP = 4 * GIB  # more KV than this only slows a CPU engine's attention, it never needs it
_CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2
                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def host_device() -> torch.device:
    """Host memory: where tensors are read from files and assembled."""
    return torch.device("cpu")


def _accelerator_module(device: torch.device) -> Any:
    """torch.cuda, or the torch.npu that importing torch_npu adds."""
    mod = getattr(torch, device.type, None)
    if mod is None or not hasattr(mod, "mem_get_info"):
        raise RuntimeError(f"no memory query for device {device} (is torch_npu imported for an NPU?)")
    return mod


def _cgroup_limit() -> tuple[int, int] | None:
    """(limit, usage) bytes of this process's memory cgroup when it has a limit; None otherwise."""
    for limit_file, usage_file in _CGROUP_FILES:
        try:
            raw = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if raw != "max" and int(raw) < 1 << 60:  # cgroup v1 writes a huge number for "no limit"
            return int(raw), usage
    return None


def _host_memory() -> tuple[int, int]:
    """(available, total) host RAM in bytes: MemAvailable (reclaimable page cache counts), bounded by a
    container's memory limit, which is what actually ends in an OOM kill."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        free = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    cgroup = _cgroup_limit()
    if cgroup is not None:
        limit, usage = cgroup
        total, free = min(total, limit), min(free, max(0, limit - usage))
    return free, total


def memory_info(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of ``device``'s memory; available host RAM for the CPU."""
    if device.type == "cpu":
        return _host_memory()
    free, total = _accelerator_module(device).mem_get_info(device.index)
    return int(free), int(total)


def kv_cache_budget(device: torch.device, requested_gb: float) -> int:
    """Bytes the KV pool may take. ``requested_gb`` > 0: exactly that (npuMemSize / cpuMemSize). Otherwise
    automatic per device: NPU and CUDA 80% of the device's free memory (call after loading the weights);
    CPU min(25% of available host RAM, 4 GiB)."""
    if requested_gb > 0:
        return int(requested_gb * GIB)
    free, _ = memory_info(device)
    if device.type == "cpu":
        budget = min(int(free * HOST_FRACTION), HOST_CAP)
    else:
        budget = int(free * ACCELERATOR_FRACTION)
    logger.info("KV cache budget on %s: %.2f GiB of %.2f GiB free", device, budget / GIB, free / GIB)
    return budget


def staging_device(device: torch.device) -> torch.device:
    """Where weights are assembled before the move to ``device``: host memory for every device today
    (safetensors reads there, and packing q/k/v in place is cheap there)."""
    return host_device()


def default_dtype(device: torch.device, checkpoint_dtype: str) -> str:
    """The dtype ``dtype: auto`` runs in: fp32 on the CPU, where the C kernels and packed GEMMs are fp32 and
    half-precision matmuls are slower, not faster; on an NPU the checkpoint's half precision, and bfloat16
    for an fp32 checkpoint (ATB's paged ops take fp16/bf16 only); the same on CUDA (half the bytes a decode step
    streams, and tensor cores)."""
    if device.type == "cpu":
        return "float32"
    if device.type in ("npu", "cuda") and checkpoint_dtype not in ("float16", "bfloat16"):
        return "bfloat16"
    return checkpoint_dtype


def apply_thread_settings(num_threads: int | None) -> None:
    """Intra-op threads for CPU ops (the C kernels follow torch.get_num_threads()); None keeps torch's default."""
    if num_threads:
        torch.set_num_threads(num_threads)
        logger.info("intra-op threads: %d", num_threads)


def fast_path_note(device: torch.device) -> str:
    """What the device reason (start-up log, /info) adds about fast paths: on the CPU whether the C kernels
    run and why (``; CPU kernels: on (...)``); on CUDA and NPUs whether the Triton kernels run and why
    (``; Triton kernels: on (triton 3.9.0: ...)``). Loads the kernels on the CPU."""
    if device.type == "cpu":
        return f"; {cpu_kernels.describe()}"
    note = triton_support.describe(device.type)
    logger.info("%s on %s", note, device)
    return f"; {note}"

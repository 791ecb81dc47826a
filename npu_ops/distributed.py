"""What tensor parallelism needs to know about devices: the torch.distributed backend of each device
type, the device a rank runs on, and the CPU threads a rank may use. Only npu_ops names a device."""
from __future__ import annotations

import importlib
import logging
import os
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from npu_ops.device import DeviceInfo

logger = logging.getLogger(__name__)

# hccl ships with torch_npu (CANN), nccl with CUDA builds of torch, gloo with every build.
BACKENDS = {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}


def backend_for(device_type: str) -> str:
    return BACKENDS.get(device_type, "gloo")


def on_device(info: DeviceInfo, logical_id: int) -> DeviceInfo:
    """``info`` placed on logical device ``logical_id`` (an npuDeviceIds entry, counted after
    ASCEND_RT_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES), made the current device of this process. On the CPU
    the id only counts ranks: every rank shares host memory."""
    if info.type == "cpu":
        return info
    mod = getattr(torch, info.type, None)
    count = mod.device_count() if mod is not None and hasattr(mod, "device_count") else 0
    if logical_id >= count:
        raise ValueError(f"Parameter npuDeviceIds must name visible {info.type} devices (0 to {count - 1}), "
                         f"got {logical_id}")
    mod.set_device(logical_id)  # type: ignore[union-attr]
    return replace(info, index=logical_id, reason=f"{info.reason}; device {logical_id}")


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads_per_rank(world_size: int, requested: int | None = None) -> int:
    """Intra-op threads for one rank: the configured count, else the cores shared evenly (at least 1),
    so that ranks on one host do not oversubscribe it."""
    if requested:
        return requested
    return max(1, cpu_cores() // max(1, world_size))


def new_group(backend: str, store: Any, rank: int, world: int, timeout: timedelta) -> Any:
    """A process group object of its own (no torch.distributed default group, so that several engine
    instances, each with its own ranks, live in one process). Collectives are its methods."""
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world, timeout)
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world, opts)
    if backend == "hccl":  # pragma: no cover - needs torch_npu and NPUs
        c10d = importlib.import_module("torch_npu._C._distributed_c10d")
        opts = c10d.ProcessGroupHCCL.Options()
        opts._timeout = timeout
        return c10d.ProcessGroupHCCL(store, rank, world, opts)
    raise ValueError(f"unknown torch.distributed backend {backend!r}")

"""Pick the device once: torch_npu importable and a supported NPU present -> npu; else CUDA -> cuda; else cpu.

On an NPU the paged-attention fast paths are Ascend's ATB ops, which live in the NNAL package, not in
torch_npu: a host without NNAL still runs (the PyTorch reference path on the NPU), and says why. Ascend
310P and 910A keep paged KV caches in the NZ format, which this engine does not build yet: they are
refused with a message naming what is supported."""
from __future__ import annotations

import ctypes
import importlib
import logging
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

# SoC names as torch.npu.get_device_name reports them: Atlas A2 (Ascend910B1..4) and A3 (Ascend910_93xx).
_SUPPORTED_SOC = re.compile(r"^Ascend910(B\d*|_93\d*)$")
SUPPORTED_SOCS = "Atlas A2/A3 (Ascend910B*, Ascend910_93*)"


@dataclass(frozen=True)
class DeviceInfo:
    type: str  # "npu" | "cuda" | "cpu"
    reason: str  # why this device was chosen, shown in /info and the start-up log
    index: int = 0  # the logical device id (npuDeviceIds); ignored on the CPU

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.type if self.type == "cpu" else f"{self.type}:{self.index}")


def soc_problem(name: str) -> str | None:
    """Why the NPU called ``name`` cannot run this engine; None when it can."""
    if _SUPPORTED_SOC.match(name):
        return None
    return (f"{name} is not supported: its paged attention needs NZ-format KV caches, which are not built yet; "
            f"supported NPUs are {SUPPORTED_SOCS}")


@lru_cache(maxsize=1)
def atb_status() -> tuple[bool, str]:
    """(found, why) for Ascend's ATB library (libatb.so, from the NNAL package): torch_npu's
    ``_npu_reshape_and_cache`` and ``_npu_paged_attention`` open it at their first call, so probe it
    before choosing the fast path instead of failing at the first forward pass."""
    home = os.environ.get("ATB_HOME_PATH")
    candidates = [str(Path(home) / "lib" / "libatb.so")] if home else []
    candidates.append("libatb.so")  # found through LD_LIBRARY_PATH, as set_env.sh of NNAL sets it
    errors = []
    for lib in candidates:
        try:
            ctypes.CDLL(lib)
            return True, f"ATB from {lib}"
        except OSError as exc:
            errors.append(str(exc))
    return False, "ATB (NNAL) not found: source nnal/atb/set_env.sh" + (f" ({errors[-1]})" if errors else "")


def _npu_status() -> tuple[bool, str]:
    try:
        importlib.import_module("torch_npu")
    except ImportError:
        return False, "torch_npu not installed"
    except Exception as exc:  # torch_npu present but CANN libraries missing or broken
        return False, f"torch_npu installed but unusable ({type(exc).__name__}: {exc})"
    npu = getattr(torch, "npu", None)
    if npu is None or not npu.is_available() or npu.device_count() == 0:
        return False, "torch_npu installed but no NPU present"
    soc = str(npu.get_device_name(0))
    problem = soc_problem(soc)
    if problem is not None:
        return False, problem
    atb_ok, atb_why = atb_status()
    fast = "ATB paged attention" if atb_ok else f"{atb_why}; paged attention on the PyTorch reference path"
    if not atb_ok:
        logger.warning("%s", atb_why)
    return True, f"torch_npu with {npu.device_count()} NPU(s) ({soc}); {fast}"


def select_device(requested: str | None = None) -> DeviceInfo:
    """Choose the device; ``requested`` ("npu", "cuda", "cpu") forces one and fails if absent."""
    npu_ok, npu_why = _npu_status() if requested in (None, "npu") else (False, "not requested")
    if requested == "npu" and not npu_ok:
        raise ValueError(f"Parameter device must name an available device, got 'npu' ({npu_why})")
    if npu_ok:
        info = DeviceInfo("npu", npu_why)
    elif requested in (None, "cuda") and torch.cuda.is_available():
        info = DeviceInfo("cuda", f"{npu_why}; CUDA available ({torch.cuda.get_device_name(0)})")
    elif requested == "cuda":
        raise ValueError("Parameter device must name an available device, got 'cuda' (CUDA not available)")
    else:
        why = "requested" if requested == "cpu" else f"{npu_why}; CUDA not available"
        info = DeviceInfo("cpu", why)
    logger.info("device: %s (%s)", info.type, info.reason)
    return info

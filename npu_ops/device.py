"""Pick the device once: torch_npu importable and an NPU present -> npu; else CUDA -> cuda; else cpu."""
from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceInfo:
    type: str  # "npu" | "cuda" | "cpu"
    reason: str  # why this device was chosen, shown in /info and the start-up log

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.type if self.type == "cpu" else f"{self.type}:0")


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
    return True, f"torch_npu with {npu.device_count()} NPU(s)"


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

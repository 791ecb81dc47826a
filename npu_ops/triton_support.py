"""Whether Triton kernels can run on a device, and why not: the one question the op dispatch asks.

One Triton source serves two devices: CUDA through ``triton`` itself, and Ascend NPUs through
``triton-ascend`` (on PyPI beside ``triton``; it installs the ``triton`` package with an NPU backend, as
vLLM-Ascend uses it). Triton's interpreter (``TRITON_INTERPRET=1``, read when a kernel is decorated) runs
the same kernels on CPU tensors: the tests hold every kernel against the PyTorch reference that way. The
CPU never takes Triton in serving (the interpreter is orders of magnitude slower than the C kernels).

Nothing here imports triton at module import: the kernel modules (``npu_ops/triton_*.py``) do, and the
ops import those only once this module said yes."""
from __future__ import annotations

import importlib
import logging
import os
from functools import lru_cache

logger = logging.getLogger(__name__)

KERNEL_OPS = ("paged attention", "KV write", "RMSNorm (+ residual)", "rotary", "W8A8 matmul")


@lru_cache(maxsize=1)
def triton_import() -> tuple[str | None, str]:
    """(version, why): the installed triton's version, or None and why it cannot be imported."""
    try:
        triton = importlib.import_module("triton")
    except Exception as exc:  # noqa: BLE001 - absent, or present but broken (a missing driver library)
        return None, f"triton not importable ({type(exc).__name__}: {exc})"
    return str(getattr(triton, "__version__", "?")), "triton importable"


def interpreted() -> bool:
    """True where Triton runs kernels in its interpreter (CPU tensors; the tests)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@lru_cache(maxsize=1)
def _ascend_backend() -> tuple[bool, str]:
    """Is the installed triton triton-ascend (an NPU backend)? Its distribution is named triton-ascend."""
    try:
        from importlib import metadata
        metadata.version("triton-ascend")
        return True, "triton-ascend installed"
    except Exception:  # noqa: BLE001 - PackageNotFoundError, or no metadata at all
        return False, "triton-ascend not installed (the triton found has no NPU backend)"


@lru_cache(maxsize=4)
def status(device_type: str) -> tuple[bool, str]:
    """(usable, why) for Triton kernels on ``device_type`` ("cuda", "npu", "cpu")."""
    version, why = triton_import()
    if device_type == "cpu":
        return interpreted() and version is not None, ("Triton's interpreter (TRITON_INTERPRET=1)" if interpreted()
                                                       else "the CPU runs its C kernels, not Triton")
    if version is None:
        return False, why
    if device_type == "npu":
        ok, ascend_why = _ascend_backend()
        return ok, f"{ascend_why} (triton {version})" if ok else ascend_why
    if device_type == "cuda":
        return True, f"triton {version}"
    return False, f"no Triton backend for {device_type}"


def usable(device_type: str) -> bool:
    return status(device_type)[0]


def describe(device_type: str) -> str:
    """One line for /info and the start-up log: which ops run as Triton kernels on this device, or why none."""
    ok, why = status(device_type)
    if ok:
        return f"Triton kernels: on ({why}: {', '.join(KERNEL_OPS)})"
    return f"Triton kernels: off ({why}); PyTorch reference path"


def next_pow2(n: int) -> int:
    """tl.arange needs a power-of-two extent: the padded width of a dimension of size ``n``."""
    return 1 << max(0, (int(n) - 1).bit_length())

"""Host memory for large, long-lived tensors (the KV pool): backed by transparent huge pages on Linux.

Decode attention reads each sequence's blocks from anywhere in a pool of hundreds of MB; with 4 KiB
pages nearly every block costs TLB misses, with 2 MiB pages almost none (the CPU attention kernel
runs about 10% faster). Where THP is off, unsupported, or not Linux, this is a plain allocation."""
from __future__ import annotations

import ctypes
import logging
import sys
from functools import lru_cache

import torch

logger = logging.getLogger(__name__)

_HUGE = 2 << 20
_MADV_HUGEPAGE = 14


@lru_cache(maxsize=1)
def _madvise() -> ctypes._CFuncPtr | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.zeros`` whose CPU memory is advised to huge pages before it is first touched."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    t = torch.empty(shape, dtype=dtype)
    start = -(-t.data_ptr() // _HUGE) * _HUGE  # the 2 MiB-aligned interior of the allocation
    end = (t.data_ptr() + t.numel() * t.element_size()) // _HUGE * _HUGE
    madvise = _madvise()
    if madvise is not None and end > start and madvise(start, end - start, _MADV_HUGEPAGE) != 0:
        logger.debug("madvise(MADV_HUGEPAGE) refused (errno %d): KV pool on 4 KiB pages", ctypes.get_errno())
    return t.zero_()  # zeros, not empty: first touch here faults the huge pages in

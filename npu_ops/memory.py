"""Host memory for large, long-lived tensors (the KV pool, the packed weights): backed by transparent huge
pages on Linux.

Decode attention reads each sequence's blocks from anywhere in a pool of hundreds of MB; with 4 KiB
pages nearly every block costs TLB misses, with 2 MiB pages almost none (the CPU attention kernel
runs about 10% faster). A decode step streams every packed weight once: on 4 KiB pages each page is a TLB
miss and a halt of the hardware prefetcher, which stops at page boundaries. Where THP is off, unsupported,
or not Linux, these are plain allocations.

The memory comes from a fresh anonymous mapping, not from ``torch.empty``: glibc serves an allocation below its
(growing) mmap threshold, up to 32 MiB, from heap memory that was touched before, already on 4 KiB pages that an
madvise no longer changes (a SmolLM2-135M KV pool of 24 MB was, and its attention read every block through the
TLB)."""
from __future__ import annotations

import ctypes
import logging
import math
import mmap
import os
import sys
from functools import lru_cache

import torch

logger = logging.getLogger(__name__)

def rss_bytes() -> int | None:
    """The process's resident memory now (Linux: /proc/self/statm), else its peak (getrusage), else None: what the
    ready line, /info and the model loader's last line say."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
    except (ImportError, OSError):
        return None


def trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim(0)``): memory a load allocated and freed
    (read buffers, transient copies) otherwise stays in the RSS. A no-op where glibc is not the allocator."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def rss_mib() -> int | None:
    rss = rss_bytes()
    return None if rss is None else round(rss / 2**20)


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


def _advise_huge(t: torch.Tensor) -> None:
    """Ask for huge pages under ``t`` (untouched memory: its first touch faults them in)."""
    start = -(-t.data_ptr() // _HUGE) * _HUGE  # the 2 MiB-aligned interior of the allocation
    end = (t.data_ptr() + t.numel() * t.element_size()) // _HUGE * _HUGE
    madvise = _madvise()
    if madvise is not None and end > start and madvise(start, end - start, _MADV_HUGEPAGE) != 0:
        logger.debug("madvise(MADV_HUGEPAGE) refused (errno %d): 4 KiB pages", ctypes.get_errno())


def _fresh(nbytes: int) -> torch.Tensor:
    """``nbytes`` uint8 from a huge page's start, on memory never touched before where THP applies: a private
    anonymous mapping of its own (released with the last tensor that views it), else ``torch.empty``."""
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    if sys.platform.startswith("linux") and flags:
        buf = torch.frombuffer(mmap.mmap(-1, nbytes + _HUGE, flags=flags), dtype=torch.uint8)  # holds the mapping
    else:
        buf = torch.empty(nbytes + _HUGE, dtype=torch.uint8)
    start = -buf.data_ptr() % _HUGE
    t = buf[start:start + nbytes]
    _advise_huge(t)
    return t


def scratch(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised 1-D CPU tensor on an anonymous mapping of its own (Linux; else ``torch.empty``): a work buffer
    whose pages leave the RSS when it is dropped, whichever thread allocated it. glibc keeps a freed block below its
    mmap threshold in the allocating thread's arena, and a thread arena's top is never trimmed (malloc_trim
    included). Only touched pages are resident."""
    nbytes = max(numel, 1) * dtype.itemsize
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    if not (sys.platform.startswith("linux") and flags):
        return torch.empty(numel, dtype=dtype)
    return torch.frombuffer(mmap.mmap(-1, nbytes, flags=flags), dtype=torch.uint8).view(dtype)[:numel]


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.zeros`` whose CPU memory is advised to huge pages before it is first touched."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    t = _fresh(math.prod(shape) * dtype.itemsize).view(dtype).view(shape)
    return t.zero_()  # zeros, not empty: first touch here faults the huge pages in


class HugeArena:
    """One allocation advised to huge pages, handed out front to back in ``align``-byte aligned pieces: a
    model's packed weights in the order a step reads them. Pages are faulted in as they are written, so a
    caller that drops each original as soon as its copy is in holds the weights once, plus the largest."""

    def __init__(self, nbytes: int, align: int = 64) -> None:
        self.align = align
        self.buf = _fresh(nbytes)  # from a huge page's start: the first weights too
        self.used, self.end = 0, nbytes

    @staticmethod
    def room(tensors: list[torch.Tensor], align: int = 64) -> int:
        return sum(-(-t.numel() * t.element_size() // align) * align for t in tensors)

    def copy_in(self, t: torch.Tensor) -> torch.Tensor:
        n = t.numel() * t.element_size()
        if self.used + n > self.end:
            raise ValueError("arena full")
        out = self.buf[self.used:self.used + n].view(t.dtype).view(t.shape).copy_(t)
        self.used += -(-n // self.align) * self.align
        return out

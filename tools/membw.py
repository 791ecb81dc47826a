"""The machine's memory bandwidth, for the one-stream (decode) bound: probes a bench runs beside its figures.

tools/membw.c, built here on first use (gcc -O3 -march=native -fopenmp, into .cache/membw/) and loaded with
ctypes (no torch: llama.cpp's harness runs it in its own venv); in a process that has PyTorch loaded it shares
PyTorch's OpenMP runtime, as our kernels do.
- ``read_only``: a prefetching AVX2 read of a buffer far larger than the last-level cache (32 MiB here): what
  streaming weights does, so the bound a decode step is held to;
- ``triad``: STREAM's a = b + s * c, counted as STREAM counts it (3 arrays' bytes a pass: the write-allocate read
  of ``a`` is not counted);
- ``Probe``: a read pass over exactly the bytes one decode step reads, for paired measurements. This VM's
  bandwidth moves with its neighbours by 1.5x within seconds (30-47 GB/s in one minute here), so a share of
  the bound is only meaningful when step and probe alternate: share = sum(probe seconds) / sum(step seconds).

    PYTHONPATH=$PWD .venv/bin/python tools/membw.py [--reps 20] [--threads 2]
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import statistics
import subprocess
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

SRC = Path(__file__).with_name("membw.c")
STREAMS = 8  # membw.c's streams a thread
MIB = 2 ** 20
# Decode steps between probe rounds (bench_real.py, llamacpp_harness.py): a probe evicts every cache, and a step
# right after one pays for it (the Python around the kernels most), so the steps and their probes alternate in
# runs of 8 (~0.1 s, well inside the seconds over which this VM's bandwidth moves).
PAIR_STEPS = 8


@lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    flags = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11"]
    key = hashlib.sha256((SRC.read_text() + " ".join(flags)).encode()).hexdigest()[:12]
    out = Path(__file__).resolve().parents[1] / ".cache" / "membw" / f"membw-{key}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        part = out.with_suffix(f".{os.getpid()}.part")
        subprocess.run(["gcc", *flags, "-o", str(part), str(SRC)], check=True, capture_output=True, timeout=120)
        os.replace(part, out)
    lib = ctypes.CDLL(str(out))
    lib.probe_alloc.argtypes, lib.probe_alloc.restype = [ctypes.c_int64], ctypes.c_void_p
    lib.probe_free.argtypes, lib.probe_free.restype = [ctypes.c_void_p], None
    lib.read_pass.argtypes, lib.read_pass.restype = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int], ctypes.c_double
    lib.triad_pass.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_float,
                               ctypes.c_int]
    lib.triad_pass.restype = None
    return lib


def default_threads() -> int:
    return int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)


@dataclass(frozen=True)
class Bandwidth:
    """GB/s of one probe: the median of the passes, and the slowest and fastest pass."""

    median: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.median:.1f} GB/s (passes {self.low:.1f}-{self.high:.1f})"


class Probe:
    """``read()``: the seconds one read pass over ``nbytes`` takes with ``threads`` threads; ``triad()``: the
    seconds a STREAM triad takes to move ``triad_bytes`` as STREAM counts bytes (12 a float element)."""

    def __init__(self, nbytes: int, threads: int = 0, triad_bytes: int = 0) -> None:
        self.threads = threads or default_threads()
        unit = self.threads * STREAMS * 32  # membw.c splits a pass into this many equal runs of whole steps
        self.floats = max(unit, nbytes // 4 // unit * unit)
        self.triad_n = triad_bytes // 12
        self.lib = _lib()  # held: close() may run from __del__ while the interpreter tears the module down
        self.ptr = self.lib.probe_alloc(self.floats)
        self.arrays = [self.lib.probe_alloc(self.triad_n) for _ in range(3)] if self.triad_n else []
        if not self.ptr or not all(self.arrays):
            self.close()
            raise MemoryError(f"no {nbytes} + {triad_bytes // 4} bytes for the bandwidth probe")

    @property
    def nbytes(self) -> int:
        return 4 * self.floats

    @property
    def triad_bytes(self) -> int:
        """The bytes a triad pass moves, as STREAM counts them."""
        return 12 * self.triad_n

    def read(self) -> float:
        t = time.perf_counter()
        self.lib.read_pass(self.ptr, self.floats, self.threads)
        return time.perf_counter() - t

    def triad(self) -> float:
        t = time.perf_counter()
        self.lib.triad_pass(*self.arrays, self.triad_n, 3.0, self.threads)
        return time.perf_counter() - t

    def close(self) -> None:
        for p in [self.ptr, *self.arrays]:
            if p:
                self.lib.probe_free(p)
        self.ptr, self.arrays = None, []

    def __del__(self) -> None:
        self.close()


def _summary(rates: list[float]) -> Bandwidth:
    return Bandwidth(statistics.median(rates), min(rates), max(rates))


def read_only(mib: int = 512, reps: int = 20, threads: int = 0) -> Bandwidth:
    """Passes over one ``mib`` MiB buffer."""
    probe = Probe(mib * MIB, threads)
    probe.read()  # threads awake, pages resident
    rates = [probe.nbytes / probe.read() / 1e9 for _ in range(reps)]
    probe.close()
    return _summary(rates)


def triad(mib: int = 128, reps: int = 20, threads: int = 0) -> Bandwidth:
    """STREAM triad over three ``mib`` MiB fp32 arrays."""
    probe = Probe(0, threads, 3 * mib * MIB)
    probe.triad()  # threads awake, pages resident
    rates = [probe.triad_bytes / probe.triad() / 1e9 for _ in range(reps)]
    probe.close()
    return _summary(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    print(f"{args.threads or default_threads()} threads")
    for r in range(args.rounds):
        print(f"round {r}: triad {triad(reps=args.reps, threads=args.threads)}; "
              f"read-only {read_only(reps=args.reps, threads=args.threads)}", flush=True)


if __name__ == "__main__":
    main()

"""The machine's memory bandwidth, for the one-stream (decode) bound: GB/s that a bench prints beside its figures.

Two probes over arrays far larger than the last-level cache (32 MiB here), each run with PyTorch's threads:
- a STREAM triad, ``a = b + s * c``, counted as STREAM counts it (3 arrays' bytes a pass; the write-allocate
  read of ``a`` is not counted, so this is below the bus's real traffic);
- a read-only pass (the sum of one array): what streaming weights does, the tighter bound for a decode step.

A VM's bandwidth moves with its neighbours (this machine measured 40 and 86 GB/s twenty minutes apart), so a
figure is the median of ``reps`` passes with its spread, and a bench takes one right beside each run it divides.

    PYTHONPATH=$PWD .venv/bin/python tools/membw.py [--reps 20]
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch

MIB = 2 ** 20


@dataclass(frozen=True)
class Bandwidth:
    """GB/s of one probe: the median of the passes, and the slowest and fastest pass."""

    median: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.median:.1f} GB/s (passes {self.low:.1f}-{self.high:.1f})"


def _passes(fn: object, nbytes: int, reps: int) -> Bandwidth:
    fn()  # pages touched, threads awake
    rates = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        rates.append(nbytes / (time.perf_counter() - t) / 1e9)
    return Bandwidth(statistics.median(rates), min(rates), max(rates))


def triad(mib: int = 128, reps: int = 20) -> Bandwidth:
    """STREAM triad over three ``mib`` MiB fp32 arrays."""
    n = mib * MIB // 4
    a, b, c = torch.empty(n), torch.rand(n), torch.rand(n)
    return _passes(lambda: torch.add(b, c, alpha=3.0, out=a), 3 * 4 * n, reps)


def read_only(mib: int = 512, reps: int = 20) -> Bandwidth:
    """One ``mib`` MiB fp32 array summed: reads only, as a decode step reads its weights."""
    x = torch.rand(mib * MIB // 4)
    return _passes(lambda: x.sum(), 4 * x.numel(), reps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"{torch.get_num_threads()} threads")
    for r in range(args.rounds):
        print(f"round {r}: triad {triad(reps=args.reps)}; read-only {read_only(reps=args.reps)}", flush=True)


if __name__ == "__main__":
    main()

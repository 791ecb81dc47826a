#!/usr/bin/env python3
"""A/B of builds of the GGUF int8-activation kernels, one core, in one process: the loaded sources built as they are
("cur"), an AVX2-only build ("avx2": no AVX-512, no VNNI) and builds with a macro set (NAME=VALUE, e.g. GGUF_LANES_ROWS=2:
the row count from which the 8-row lanes take over from the row passes). Each variant's output bits are checked
equal to the AVX2 build's at every row count, then timed in CPU time (process_time), rounds alternated, the best
round kept: a busy machine moves a round's wall time far more than its CPU time.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python tools/ab_lanes.py Q4_0,Q4_K cur,GGUF_LANES_ROWS=2 --rows 1 2 3 4 16
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from npu_ops import cpu_kernels, gguf_cpu  # noqa: E402
from npu_ops.quant_gguf import GgufWeight  # noqa: E402


def _weight(kind: str, n: int, k: int) -> GgufWeight:
    from tests.unit import test_gguf_kquant, test_gguf_q5, test_gguf_q8
    if kind.endswith("_K"):
        return GgufWeight(test_gguf_kquant.weights(n, k, kind, 1), kind, (n, k))
    return (test_gguf_q5 if kind.startswith("Q5_") else test_gguf_q8).random_weight(kind, n, k, 1)


def _builds(variants: list[str]) -> dict[str, ctypes.CDLL]:
    flags = {"avx2": cpu_kernels.AVX2_ONLY, **{v: [] if v == "cur" else [f"-D{v}"] for v in variants}}
    return {name: cpu_kernels.build_variant(f) for name, f in flags.items()}


def _rate(x: torch.Tensor, w: GgufWeight, lib: ctypes.CDLL, budget: float = 0.12) -> float:
    t, n = time.process_time(), 0
    while time.process_time() - t < budget:
        gguf_cpu.matmul(x, w, int8_rows=True, lib=lib)
        n += 1
    return (time.process_time() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kinds", help="block types, comma-separated (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)")
    ap.add_argument("variants", help="builds besides avx2, comma-separated: cur and NAME=VALUE macros")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 16, 64])
    ap.add_argument("--shape", type=int, nargs=2, default=[2048, 2048], metavar=("N", "K"))
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    libs, (n, k) = _builds(args.variants.split(",")), args.shape
    print(f"one core, {n} x {k}, load average {os.getloadavg()[0]:.2f}; GMAC/s (best of {args.rounds} rounds)")
    for kind in args.kinds.split(","):
        w = _weight(kind, n, k)
        for m in args.rows:
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
            want = gguf_cpu.matmul(x, w, int8_rows=True, lib=libs["avx2"])
            best: dict[str, float] = {}
            for _ in range(args.rounds):
                for name, lib in libs.items():
                    assert torch.equal(gguf_cpu.matmul(x, w, int8_rows=True, lib=lib), want), (kind, m, name)
                    best[name] = min(best.get(name, 1e9), _rate(x, w, lib))
            g = n * k * m / 1e9
            cells = ", ".join(f"{name} {g / s:.1f} ({best['avx2'] / s:.2f}x)" for name, s in best.items())
            print(f"{kind} M={m}: {cells}", flush=True)


if __name__ == "__main__":
    main()

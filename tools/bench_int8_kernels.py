#!/usr/bin/env python3
"""The int8 linears against the fp32 one on SmolLM2-135M's shapes (one layer: qkv 576->960, o 576->576,
gate_up 576->3072, down 1536->576), kernels only, random weights; rounds alternate fp32 / w8a16 / w8a8 and the
best of each is kept. Prints which W8A8 core this build runs (vnni | maddubs).

    PYTHONPATH=$PWD .venv/bin/python tools/bench_int8_kernels.py --rows 1 8 32 --threads 2
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from npu_ops import cpu_kernels, quant, quant_cpu  # noqa: E402

SHAPES = [("qkv", 576, 960), ("o", 576, 576), ("gate_up", 576, 3072), ("down", 1536, 576)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    packs = []
    for _, k, n in SHAPES:
        w = torch.randn(n, k) * 0.05
        wq, s = quant.quantize_weight(w)
        packs.append((k, n, cpu_kernels.pack_weight(w), quant_cpu.pack(wq, "w8a16"), quant_cpu.pack(wq, "w8a8"), s))
    print(f"W8A8 core: {quant_cpu.w8a8_core()}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}")
    for m in args.rows:
        xs = [torch.randn(m, k) for k, *_ in packs]
        calls = {
            "fp32": lambda: [cpu_kernels.linear(x, pf, n, None) for x, (k, n, pf, *_) in zip(xs, packs)],
            "w8a16": lambda: [quant_cpu.linear(x, p16, "w8a16", s, k, n, None)
                              for x, (k, n, _, p16, _, s) in zip(xs, packs)],
            "w8a8": lambda: [quant_cpu.linear(x, p8, "w8a8", s, k, n, None) for x, (k, n, _, _, p8, s) in zip(xs, packs)],
        }
        best = dict.fromkeys(calls, float("inf"))
        reps = max(3, 200 // m)
        for _ in range(args.rounds):
            for name, call in calls.items():
                t = time.perf_counter()
                for _ in range(reps):
                    call()
                best[name] = min(best[name], (time.perf_counter() - t) / reps)
        f = best["fp32"]
        print(f"M={m:3d} fp32 {f * 1e6:8.1f} us/layer  " + "  ".join(
            f"{k} {v * 1e6:8.1f} ({f / v:.2f}x)" for k, v in best.items() if k != "fp32"), flush=True)
    print(f"load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

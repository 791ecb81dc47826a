#!/usr/bin/env python3
"""The GGUF block kernels (npu_ops/csrc/gemm_gguf.c through csrc/gguf_linear.c) against the packed fp32 linear on
SmolLM2-135M's shapes (one layer: qkv 576->960, o 576->576, gate_up 576->3072, down 1536->576), kernels only,
random blocks; rounds alternate fp32 and each block type and the best of each is kept. For one row (a decode step:
bandwidth-bound) it also prints the weight bytes each read per second. Figures only on a quiet machine.

    PYTHONPATH=$PWD .venv/bin/python tools/bench_gguf_kernels.py --rows 1 8 64 --threads 2 [--kinds Q4_0 Q4_1 Q8_0]

``--gemv N K``: one [N, K] matrix per block type (e.g. 2048 8192: SmolLM2-1.7B's down projection), its fp32-activation
kernel against its int8-activation one (csrc/gemm_gguf_q8.c, ggufActivations int8) at each ``--rows``: GB/s of
weights read (below GEMM_ROWS rows copies enough to pass the last-level cache are cycled, so the bytes come from
memory: a decode step), GFLOP/s (2 M N K a second: a prefill's GEMM, compute-bound) and the int8/fp32 speed ratio.
Decode steps take int8 at any row count under the default ggufActivations int8; the ratio at prefill sizes (64 to
512 rows) is what ``int8-all`` (prefill on int8 too) buys.

    PYTHONPATH=$PWD .venv/bin/python tools/bench_gguf_kernels.py --gemv 2048 8192 --rows 1 4 16 64 256 512 --kinds Q4_0

``--batch``: the int8-activation kernels (ggufActivations int8, each type's fn_q8) at a batch of decode rows on one
SmolLM2-1.7B layer's shapes (q, k, v, o 2048->2048, gate and up 2048->8192, down 8192->2048; random blocks, cycled
past the last-level cache): GFLOP/s (2 M N K a second: these calls are bound by the arithmetic) and weight GB/s,
beside a STREAM triad measured in the same run (the machine is shared: compare ratios). --kinds and --rows as given,
default all six packed types at 16 and 32 rows.

    PYTHONPATH=$PWD .venv/bin/python tools/bench_gguf_kernels.py --batch --threads 2

``--batch --team``: the same layer through the team a decode step runs (csrc/gguf_linear.c), x quantized once for
the team against each thread quantizing all of x itself, alternated in one run: the ratio.

``--tiles N K``: a prompt piece's projection: the packed fp32-activation kernel against csrc/gemm_gguf_tile.c's
tiles (what prefill pieces run) and sgemm over the dequantized weights, GFLOP/s at each ``--rows``.

    PYTHONPATH=$PWD .venv/bin/python tools/bench_gguf_kernels.py --tiles 2560 960 --rows 1 16 64 512 --kinds Q4_0
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import membw  # noqa: E402

from npu_ops import cpu_kernels  # noqa: E402
from npu_ops.gguf_modules import STEP_DECODE, GgufLinear, gguf_step  # noqa: E402
from npu_ops.quant_gguf import GgufWeight, block_type  # noqa: E402

SHAPES = [("qkv", 576, 960), ("o", 576, 576), ("gate_up", 576, 3072), ("down", 1536, 576)]
LAYER_17B = [(2048, 2048)] * 4 + [(8192, 2048)] * 2 + [(2048, 8192)]  # (N, K): q, k, v, o, gate, up, down
BATCH_KINDS = ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K", "Q5_K"]
GEMM_ROWS = 64  # --gemv: from this many rows of x on, one matrix (its bytes reused from cache: compute-bound)


def random_linear(kind: str, n: int, k: int) -> GgufLinear:
    bt = block_type(kind)
    assert bt is not None
    raw = np.random.default_rng(n + k).integers(0, 256, size=(n, k // bt.block_size, bt.block_bytes), dtype=np.uint8)
    raw[..., 0:2] = np.float16(0.01).reshape(1).view(np.uint8)  # a sane scale (and Q4_1's min: small)
    if bt.block_size == 256:  # K-quants: d and dmin (Q4_K, Q5_K) or d (Q6_K, its last 2 bytes) sane too
        raw[..., 2:4] = np.float16(0.001).reshape(1).view(np.uint8)
        raw[..., -2:] = np.float16(0.001).reshape(1).view(np.uint8)
    return GgufLinear([GgufWeight(torch.from_numpy(raw.reshape(n, -1).copy()), kind, (n, k))])


def best_of(call, reps: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(reps):
            call()
        best = min(best, (time.perf_counter() - t) / reps)
    return best


def gemv(kinds: list[str], n: int, k: int, rows: list[int], rounds: int, cache_mb: int) -> None:
    """fp32- against int8-activation kernels on [n, k] matrices of each kind, cycled through more than the cache."""
    from npu_ops import gguf_cpu
    for kind in kinds:
        one = random_linear(kind, n, k).parts[0]
        copies = [GgufWeight(one.data.clone(), kind, (n, k)) for _ in range(max(1, cache_mb * 2**20 // one.nbytes + 1))]
        for m in rows:
            x, ws = torch.randn(m, k), copies if m < GEMM_ROWS else copies[:1]
            times = []
            for int8 in (False, True):
                t = best_of(lambda: [gguf_cpu.matmul(x, w, int8_rows=int8) for w in ws], 1, rounds) / len(ws)
                times.append(t)
            f, q = times
            flop = 2 * m * n * k
            print(f"{kind} [{n}, {k}] M={m:3d}: fp32 x {f * 1e6:9.1f} us ({one.nbytes / f / 1e9:5.1f} GB/s, "
                  f"{flop / f / 1e9:6.1f} GFLOP/s)  int8 x {q * 1e6:9.1f} us ({one.nbytes / q / 1e9:5.1f} GB/s, "
                  f"{flop / q / 1e9:6.1f} GFLOP/s)  int8 {f / q:.2f}x", flush=True)


def layer_copies(kind: str, cache_mb: int) -> tuple[list[list[GgufWeight]], int]:
    """One random 1.7B layer of ``kind`` and copies of it past ``cache_mb`` MiB (each pass reads from memory), and one
    layer's bytes."""
    layer = [random_linear(kind, n, k).parts[0] for n, k in LAYER_17B]
    nbytes = sum(w.nbytes for w in layer)
    return [layer] + [[GgufWeight(w.data.clone(), kind, w.shape) for w in layer]
                      for _ in range(cache_mb * 2**20 // nbytes)], nbytes


def batch(kinds: list[str], rows: list[int], rounds: int, cache_mb: int, threads: int) -> None:
    """Each kind's int8-activation kernels over one 1.7B layer (copies past the cache) at each row count."""
    from npu_ops import gguf_cpu
    for kind in kinds:
        layers, nbytes = layer_copies(kind, cache_mb)
        for m in rows:
            xs = {k: torch.randn(m, k) for k in (2048, 8192)}
            t = best_of(lambda: [gguf_cpu.matmul(xs[w.shape[1]], w, int8_rows=True) for ws in layers for w in ws],
                        1, rounds) / len(layers)
            flop = sum(2 * m * n * k for n, k in LAYER_17B)
            tri = membw.triad(mib=64, reps=5, threads=threads).median
            print(f"{kind} M={m:3d}: {t * 1e3:7.2f} ms/layer  {flop / t / 1e9:6.1f} GFLOP/s  {nbytes / t / 1e9:5.2f} "
                  f"GB/s of weights  (triad {tri:5.1f} GB/s: weights at {nbytes / t / 1e9 / tri:.3f} of it)",
                  flush=True)


def team_ab(kinds: list[str], rows: list[int], rounds: int, cache_mb: int) -> None:
    """--batch --team: the layer's projections as a decode step's team runs them (csrc/gguf_linear.c, each type's
    int8 kernel), x quantized once for the team against each thread quantizing all of x itself (the former way),
    alternated round by round in one run (the machine is shared: the ratio is the figure)."""
    from npu_ops import gguf_cpu
    from npu_ops.gguf_modules import INT8_ALL
    for kind in kinds:
        copies = layer_copies(kind, cache_mb)[0]  # held: a segment table points into its weights' bytes
        tables = [[(gguf_cpu.segments([w], INT8_ALL), w.shape) for w in ws] for ws in copies]
        for m in rows:
            xs = {k: torch.randn(m, k) for k in (2048, 8192)}
            best = {True: float("inf"), False: float("inf")}
            for _ in range(rounds):
                for share in (False, True):
                    gguf_cpu.share_quantized_x(share)
                    t = time.perf_counter()
                    for ws in tables:
                        for segs, (n, k) in ws:
                            gguf_cpu.linear(xs[k], segs, k, n, None, STEP_DECODE)
                    best[share] = min(best[share], (time.perf_counter() - t) / len(tables))
            gguf_cpu.share_quantized_x(True)
            print(f"{kind} M={m:3d} team: x quantized by each thread {best[False] * 1e3:7.2f} ms/layer, once for the "
                  f"team {best[True] * 1e3:7.2f}  ({best[False] / best[True]:.3f}x)", flush=True)


def tiles(kinds: list[str], n: int, k: int, rows: list[int], rounds: int) -> None:
    """A prompt piece's [n, k] projection per block type: the packed fp32-activation kernel (what a decode-kind call
    runs) against csrc/gemm_gguf_tile.c's tiles (a prefill piece's), the int8 GEMM (a prefill piece's under int8-all)
    and sgemm over the weights dequantized (torch's F.linear, and our packed fp32 linear): GFLOP/s (2 M N K a
    second) and the tiles' speed against the packed and int8 kernels."""
    from npu_ops.gguf_modules import INT8_ALL, STEP_PREFILL
    for kind in kinds:
        lin = random_linear(kind, n, k)
        w = lin.dequantized()
        wp = cpu_kernels.pack_weight(w)
        for m in rows:
            x, flop = torch.randn(m, k), 2 * m * n * k
            reps = max(1, 64 // m)
            times = []
            for step in (STEP_DECODE, STEP_PREFILL):
                with gguf_step(step):
                    times.append(best_of(lambda: lin(x), reps, rounds))
            lin.int8_steps = INT8_ALL  # the int8 GEMM a prefill piece runs under ggufActivations int8-all
            with gguf_step(STEP_PREFILL):
                times.append(best_of(lambda: lin(x), reps, rounds))
            lin.int8_steps = 0
            times.append(best_of(lambda: torch.nn.functional.linear(x, w), reps, rounds))
            times.append(best_of(lambda: cpu_kernels.linear(x, wp, n, None), reps, rounds))
            packed, tile, int8, sgemm, ours = (flop / t / 1e9 for t in times)
            print(f"{kind} [{n}, {k}] M={m:3d} GFLOP/s: packed {packed:6.1f}  tiles {tile:6.1f}  int8 {int8:6.1f}  "
                  f"torch sgemm {sgemm:6.1f}  fp32 linear {ours:6.1f}  tiles/packed {times[0] / times[1]:.2f}x  "
                  f"tiles/int8 {times[2] / times[1]:.2f}x", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=None, help="default 1 8 64 (--batch: 16 32)")
    ap.add_argument("--kinds", nargs="+", default=None, help="default Q4_0 Q4_1 Q8_0 (--batch: all six types)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--gemv", type=int, nargs=2, metavar=("N", "K"), help="fp32 vs int8 activations on one [N, K]")
    ap.add_argument("--cache-mb", type=int, default=64, help="--gemv: weight bytes cycled (past the cache)")
    ap.add_argument("--batch", action="store_true", help="int8 kernels at decode batches on 1.7B's layer shapes")
    ap.add_argument("--team", action="store_true", help="--batch: through the team (x quantized once vs per thread)")
    ap.add_argument("--tiles", type=int, nargs=2, metavar=("N", "K"), help="packed kernel vs tiles on one [N, K]")
    args = ap.parse_args()
    if cpu_kernels.load() is None:
        sys.exit("the CPU kernels are not built here")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.batch:
        print(f"{torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}")
        if args.team:
            team_ab(args.kinds or BATCH_KINDS, args.rows or [16, 32], args.rounds, args.cache_mb)
        else:
            batch(args.kinds or BATCH_KINDS, args.rows or [16, 32], args.rounds, args.cache_mb, args.threads)
        print(f"load at the end {os.getloadavg()[0]:.1f}")
        return
    args.kinds, args.rows = args.kinds or ["Q4_0", "Q4_1", "Q8_0"], args.rows or [1, 8, 64]
    if args.tiles:
        print(f"{torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}")
        tiles(args.kinds, *args.tiles, args.rows, args.rounds)
        print(f"load at the end {os.getloadavg()[0]:.1f}")
        return
    if args.gemv:
        print(f"{torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}")
        gemv(args.kinds, *args.gemv, args.rows, args.rounds, args.cache_mb)
        print(f"load at the end {os.getloadavg()[0]:.1f}")
        return
    fp32 = [(k, n, cpu_kernels.pack_weight(torch.randn(n, k) * 0.05)) for _, k, n in SHAPES]
    layers = {kind: [random_linear(kind, n, k) for _, k, n in SHAPES] for kind in args.kinds}
    print(f"{torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}")
    for m in args.rows:
        xs = [torch.randn(m, k) for _, k, _ in SHAPES]
        reps = max(2, 100 // m)
        f = best_of(lambda: [cpu_kernels.linear(x, p, n, None) for x, (_, n, p) in zip(xs, fp32)], reps, args.rounds)
        line = f"M={m:3d} fp32 {f * 1e6:8.1f} us/layer ({sum(4 * k * n for _, k, n in SHAPES) / f / 1e9:5.1f} GB/s)"
        for kind, ls in layers.items():
            with gguf_step(STEP_DECODE):  # the packed kernels (a prefill piece would run the tiles: --tiles)
                t = best_of(lambda: [lin(x) for x, lin in zip(xs, ls)], reps, args.rounds)
            gbs = sum(lin.parts[0].nbytes for lin in ls) / t / 1e9
            line += f"  {kind} {t * 1e6:8.1f} ({f / t:.2f}x, {gbs:5.1f} GB/s)"
        print(line, flush=True)
    print(f"load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

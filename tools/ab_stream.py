#!/usr/bin/env python3
"""Interleaved A/B on the real model (rounds alternate, so contention on a shared machine hits both alike):
best tok/s of one stream (64 tokens after a 100-token real-English prompt) and, with --batch N, of N prompts
at once (16-128 tokens each, the bench_real workload's first N).

    PYTHONPATH=$PWD .venv/bin/python tools/ab_stream.py [ROUNDS] [--batch 32] [--quant]

Default: fp32 with the fused decoder layers (one C call per step) against the op-by-op path, in one engine;
--scheme w8a8|w8a16 (and --int8-head): the same A/B over int8 weights.
--quant: fp32 / w8a8 / w8a8 and w8a16 with the int8 LM head, one engine each.
"""
import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]
from bench_real import make_llm, shipped_gguf, timed_generate, workload  # noqa: E402
import torch  # noqa: E402

from mindie_service.models import fused_layers  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("rounds", type=int, nargs="?", default=3)
ap.add_argument("--batch", type=int, default=0)
ap.add_argument("--quant", action="store_true")
ap.add_argument("--scheme", choices=["w8a8", "w8a16"], default=None, help="fused vs op-by-op over int8 weights")
ap.add_argument("--int8-head", action="store_true", help="with --scheme: the int8 (W8A16) LM head")
ap.add_argument("--kv-int8", action="store_true", help="an int8 KV cache (kvCacheDtype int8)")
ap.add_argument("--threads", type=int, default=0, help="torch threads (default: as set); 1 on a loaded machine")
args = ap.parse_args()
if args.threads:
    torch.set_num_threads(args.threads)
model = str(shipped_gguf())
probe = make_llm(model, None, 2, decode_steps=1)
ids, outs = workload(probe.tokenizer, max(8, args.batch), 0)
flat = [t for p in workload(probe.tokenizer, 64, 1)[0] for t in p]
del probe
runs = iter(range(10 ** 6))


def fresh(lengths: list[int]) -> list[list[int]]:
    """Prompts of these lengths no run has used before: no prefix-cache hit favours the engine that runs second."""
    u = next(runs)
    return [flat[(u * 997 + i * 131) % (len(flat) - n):][:n] for i, n in enumerate(lengths)]



if args.quant:
    cfgs = {"fp32": (None, "float", True), "w8a8": ("w8a8", "float", True), "w8a8+int8head": ("w8a8", "int8", True),
            "w8a16+int8head": ("w8a16", "int8", True)}
    llms = {k: make_llm(model, q, max(1, args.batch), h, decode_steps=1) for k, (q, h, _) in cfgs.items()}
else:
    head = "int8" if args.int8_head else "float"
    cfgs = {"fused": (args.scheme, head, True), "op-by-op": (args.scheme, head, False)}
    one = make_llm(model, args.scheme, max(1, args.batch), head, decode_steps=1, kv="int8" if args.kv_int8 else "auto")
    llms = {k: one for k in cfgs}
best = {f"{k} {w}": 0.0 for k in cfgs for w in ["stream"] + (["batched"] if args.batch else [])}
cpu = dict.fromkeys(best, float("inf"))  # least process CPU ms per token: what contention inflates least


def timed(key: str, llm: object, prompts: list[list[int]], n_out: list[int]) -> None:
    c = time.process_time()
    best[key] = max(best[key], sum(n_out) / timed_generate(llm, prompts, n_out)[0])
    cpu[key] = min(cpu[key], (time.process_time() - c) * 1e3 / sum(n_out))



for r in range(args.rounds):
    for k, llm in llms.items():
        fused_layers.set_enabled(cfgs[k][2])
        timed(f"{k} stream", llm, fresh([100]), [64])
        if args.batch:
            n = args.batch
            timed(f"{k} batched", llm, fresh([len(p) for p in ids[:n]]), outs[:n])
    print(r, "tok/s", {k: round(v, 1) for k, v in best.items()}, "CPU ms/token", {k: round(v, 2) for k, v in cpu.items()},
          f"load {os.getloadavg()[0]:.1f}", flush=True)
if not args.quant:
    for w in ["stream"] + (["batched"] if args.batch else []):
        a, b = f"fused {w}", f"op-by-op {w}"
        print(f"{args.scheme or 'fp32'}{' +int8 head' if args.int8_head else ''} {w}: fused / op-by-op = {best[a] / best[b]:.3f} (tok/s), {cpu[b] / cpu[a]:.3f} (CPU time per token)")

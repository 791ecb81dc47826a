#!/usr/bin/env python3
"""Interleaved A/B of the KV cache's dtype on one decoding stream of the real model: engine A with the fp32 cache,
engine B with the int8 one (kvCacheDtype int8), the same weights and prompt; each decode step runs on A or B in turn
(ABBA order) and is followed by a read of the step's weight bytes (tools/membw.py's probe). This VM's bandwidth moves
by 1.5x within seconds, so only such pairs compare: B/A is the median over pairs; a share is sum(probe seconds) /
sum(step seconds) (of the bound the weights alone set: the KV bytes are what differs).

    PYTHONPATH=$PWD .venv/bin/python tools/ab_kv.py [--quant w8a8] [--int8-head] [--steps 200] [--prefill]

--prefill: the prefill instead: the workload's 8 longest prompts (216-270 tokens, each made of tokens no earlier
prompt had: no prefix-cache hit), one at a time, the engines taking turns; ms a prompt token, best of 3 rounds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

import torch  # noqa: E402

from mindie_service import LLM, SamplingParams  # noqa: E402
from mindie_service.engine.contract import EngineRequest  # noqa: E402
import membw  # noqa: E402
from bench_real import make_llm, shipped_gguf, weight_bytes, workload  # noqa: E402


def prefill(llms: dict[str, LLM]) -> None:
    ids, _ = workload(llms["A"].tokenizer, 32, 3)
    longest = sorted(ids, key=len)[-8:]
    best = dict.fromkeys(llms, float("inf"))
    for rnd in range(3):
        for name, llm in llms.items():
            fresh = [[(t + 7 * rnd + i + (name == "B") * 13) % 40000 + 100 for t in p] for i, p in enumerate(longest)]
            t0 = time.perf_counter()
            for p in fresh:
                llm.generate([p], [SamplingParams(max_tokens=1, temperature=0.0)], use_tqdm=False)
            best[name] = min(best[name], (time.perf_counter() - t0) / sum(map(len, fresh)) * 1e3)
    print(f"prefill of {len(longest)} prompts ({min(map(len, longest))}-{max(map(len, longest))} tokens), one at a "
          f"time, best of 3: A (fp32 KV) {best['A']:.3f}, B (int8 KV) {best['B']:.3f} ms a prompt token")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quant", default="w8a8", choices=["none", "w8a8", "w8a16"])
    ap.add_argument("--int8-head", action="store_true")
    ap.add_argument("--steps", type=int, default=200, help="decode steps per engine (the prompt + 2 x steps < 512)")
    ap.add_argument("--prefill", action="store_true", help="time the prefill instead of decode steps")
    args = ap.parse_args()
    q = None if args.quant == "none" else args.quant
    if args.prefill:
        prefill({name: make_llm(str(shipped_gguf()), q, 1, "int8" if args.int8_head else "float", kv=kv)
                 for name, kv in (("A", "auto"), ("B", "int8"))})
        return
    engines = {}
    for name, kv in (("A", "auto"), ("B", "int8")):
        llm = make_llm(str(shipped_gguf()), q, 1, "int8" if args.int8_head else "float", decode_steps=1, kv=kv)
        prompt = workload(llm.tokenizer, 4, 0)[0][1]
        llm.engine.add_request(EngineRequest("ab", tuple(prompt), SamplingParams(
            max_tokens=args.steps + 8, temperature=0.0, ignore_eos=True)))
        for _ in range(4):
            llm.engine.step()
        engines[name] = llm.engine
    nbytes = weight_bytes(llm)
    probe = membw.Probe(int(nbytes), torch.get_num_threads())
    step: dict[str, list[float]] = {"A": [], "B": []}
    read: dict[str, list[float]] = {"A": [], "B": []}
    for i in range(args.steps):
        for name in ("AB" if i % 2 == 0 else "BA"):
            t = time.perf_counter()
            engines[name].step()
            step[name].append(time.perf_counter() - t)
            read[name].append(probe.read())
    print(f"{args.quant}{' + int8 head' if args.int8_head else ''}, one stream from a {len(prompt)}-token prompt, "
          f"{args.steps} steps each, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}")
    for name, kv in (("A", "fp32 KV"), ("B", "int8 KV")):
        print(f"  {name} ({kv}): {statistics.median(step[name]) * 1e3:.2f} ms median step; share of the weights' "
              f"read bound {sum(read[name]) / sum(step[name]):.0%}")
    print(f"  B vs A: {statistics.median(a / b for a, b in zip(step['A'], step['B'])):.3f}x faster "
          f"(median of {len(step['A'])} pairs)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Interleaved A/B of multi-step burst lengths (decodeSteps) on one decoding stream of the real model: engine A
with --a steps a burst, engine B with --b, the same weights and prompt. Rounds alternate (ABBA); in each, an engine
decodes 8 tokens (in as many calls as its bursts take) and every token is followed by a read of the step's weight
bytes (tools/membw.py's probe). B/A is the median over rounds of the time a token; a share is sum(probe seconds) /
sum(step seconds).

    PYTHONPATH=$PWD .venv/bin/python tools/ab_bursts.py [--a 4] [--b 8] [--quant w8a8] [--int8-head] [--rounds 40]
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

from mindie_service import SamplingParams  # noqa: E402
from mindie_service.engine.contract import EngineRequest  # noqa: E402
import membw  # noqa: E402
from bench_real import make_llm, shipped_gguf, weight_bytes, workload  # noqa: E402

TOKENS = 8  # a round's tokens for each engine


def tokens(eng: object, n: int) -> int:
    got = 0
    while got < n:
        got += sum(1 for ev in eng.step() if hasattr(ev, "token"))  # type: ignore[attr-defined]
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", type=int, default=4)
    ap.add_argument("--b", type=int, default=8)
    ap.add_argument("--quant", default="w8a8", choices=["none", "w8a8", "w8a16"])
    ap.add_argument("--int8-head", action="store_true")
    ap.add_argument("--rounds", type=int, default=40, help="rounds of 8 tokens (the prompt + 8 x rounds < 450)")
    args = ap.parse_args()
    engines = {}
    for name, k in (("A", args.a), ("B", args.b)):
        llm = make_llm(str(shipped_gguf()), None if args.quant == "none" else args.quant, 1,
                       "int8" if args.int8_head else "float", decode_steps=k)
        prompt = workload(llm.tokenizer, 4, 0)[0][1]
        llm.engine.add_request(EngineRequest("ab", tuple(prompt), SamplingParams(
            max_tokens=TOKENS * args.rounds + 40, temperature=0.0, ignore_eos=True)))
        tokens(llm.engine, 24)  # the prefill, the first steps and the pacer's window
        engines[name] = llm.engine
    probe = membw.Probe(int(weight_bytes(llm)), torch.get_num_threads())
    per_token: dict[str, list[float]] = {"A": [], "B": []}
    read: dict[str, list[float]] = {"A": [], "B": []}
    for i in range(args.rounds):
        for name in ("AB" if i % 2 == 0 else "BA"):
            t = time.perf_counter()
            n = tokens(engines[name], TOKENS)
            per_token[name].append((time.perf_counter() - t) / n)
            read[name].append(sum(probe.read() for _ in range(n)) / n)
    print(f"{args.quant}{' + int8 head' if args.int8_head else ''}, one stream, {args.rounds} rounds of {TOKENS} "
          f"tokens, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}")
    for name, k in (("A", args.a), ("B", args.b)):
        print(f"  {name} ({k} steps a burst): {statistics.median(per_token[name]) * 1e3:.3f} ms a token; share of the "
              f"weights' read bound {sum(read[name]) / sum(per_token[name]):.1%}")
    ratio = statistics.median(a / b for a, b in zip(per_token["A"], per_token["B"]))
    print(f"  B vs A: {ratio:.3f}x faster (median of {args.rounds} rounds)")


if __name__ == "__main__":
    main()

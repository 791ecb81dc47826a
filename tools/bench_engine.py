#!/usr/bin/env python3
"""Engine throughput against transformers, measured in one run on the same weights.

32 prompts of 16-256 words, outputs of 16-128 tokens (EOS ignored), fp32. Prints output tokens/s
of: our engine (all 32 submitted at once), transformers one prompt at a time, and transformers
static batches of 8 (left-padded; a batch runs until its longest output is done), and the ratios.
Rounds (--rounds) interleave the three and each keeps its best, which damps a noisy machine.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from mindie_service import LLM  # noqa: E402
from mindie_service.devkit.presets import build_demo_model  # noqa: E402
from tests.prompts import bench_workload as workload, engine_tok_s  # noqa: E402


def bench_engine(model: str, prompts: list[str], outs: list[int]) -> float:
    # A new engine per run: a second run on the same one would find every prompt in the prefix cache.
    return engine_tok_s(LLM(model, dtype="float32", max_batch_size=len(prompts), cache_block_size=16), prompts, outs)


def bench_hf(model: str, prompts: list[str], outs: list[int], batch: int) -> float:
    tok = AutoTokenizer.from_pretrained(model)
    tok.padding_side = "left"
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    total = 0.0
    with torch.inference_mode():
        enc = tok(prompts[:1], return_tensors="pt")
        hf.generate(**enc, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)  # warm-up
        for i in range(0, len(prompts), batch):
            chunk, n = prompts[i:i + batch], max(outs[i:i + batch])
            enc = tok(chunk, return_tensors="pt", padding=True)
            t = time.perf_counter()
            hf.generate(**enc, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
            total += time.perf_counter() - t
    return sum(outs) / total  # useful tokens only: padding work past a row's own length is waste


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=str(ROOT / "models" / "small"))
    ap.add_argument("--preset", default="small", help="demo preset built into --model if missing")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of all three runners; each reports its best")
    args = ap.parse_args()
    build_demo_model(args.preset, args.model, if_missing=True)
    torch.manual_seed(0)
    prompts, outs = workload(args.num_prompts, args.seed)
    print(f"workload: {len(prompts)} prompts, {sum(outs)} output tokens, torch threads {torch.get_num_threads()}")
    # Rounds interleave the three runners so that a noisy neighbour slows them alike; each keeps its best round.
    runners = {"engine (continuous batching)": lambda: bench_engine(args.model, prompts, outs),
               "transformers one at a time": lambda: bench_hf(args.model, prompts, outs, 1),
               "transformers static batch 8": lambda: bench_hf(args.model, prompts, outs, 8)}
    best: dict[str, float] = {}
    for r in range(args.rounds):
        for name, run in runners.items():
            tps = run()
            best[name] = max(best.get(name, 0.0), tps)
            print(f"round {r + 1}: {name + ':':31s}{tps:8.1f} output tok/s", flush=True)
    eng, one, st8 = best.values()
    print(f"best of {args.rounds}: engine {eng:.1f}, one at a time {one:.1f}, static batch 8 {st8:.1f} output tok/s")
    print(f"ratio engine / one-at-a-time:  {eng / one:8.2f}x  (target >= 8)")
    print(f"ratio engine / static batch 8: {eng / st8:8.2f}x  (target >= 2)")


if __name__ == "__main__":
    main()

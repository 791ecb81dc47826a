#!/usr/bin/env python3
"""Batched multi-LoRA throughput against the base model, measured in one run on the same engine.

A batch of 32 prompts (16-128 words, 64 output tokens each, EOS ignored, fp32) runs twice on one
engine: every request on the base model, then the same requests spread round-robin over 4
demo adapters (one continuous batch, all adapters resident). Prints output tokens/s of both and
their ratio (target >= 0.7). Each side is timed --rounds times, alternating, and the best kept,
so a neighbour's burst of CPU use does not decide the ratio.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mindie_service import LLM, SamplingParams  # noqa: E402
from mindie_service.devkit.lora import build_demo_lora  # noqa: E402
from mindie_service.devkit.presets import build_demo_model  # noqa: E402
from tests.prompts import WORDS  # noqa: E402


def workload(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(16, 128))) for _ in range(n)]


def timed(llm: LLM, prompts: list[str], params: list[SamplingParams]) -> tuple[float, list[list[int]]]:
    t = time.perf_counter()
    res = llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t
    outs = [r.outputs[0].token_ids for r in res]
    return sum(len(o) for o in outs) / dt, outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=str(ROOT / "models" / "small"))
    ap.add_argument("--preset", default="small", help="demo preset built into --model if missing")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    build_demo_model(args.preset, args.model, if_missing=True)
    torch.manual_seed(0)
    prompts = workload(args.num_prompts, args.seed)
    llm = LLM(args.model, dtype="float32", max_batch_size=args.num_prompts, cache_block_size=16,
              enable_prefix_caching=False, max_loras=args.adapters, max_lora_rank=args.rank)
    with tempfile.TemporaryDirectory() as tmp:
        names = []
        for i in range(args.adapters):
            names.append(f"demo{i}")
            llm.engine.load_adapter(names[-1], str(build_demo_lora(args.model, f"{tmp}/a{i}", rank=args.rank,
                                                                   seed=i)))

    def params(adapter: str | None) -> SamplingParams:
        return SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True, adapter_id=adapter)

    base = [params(None)] * len(prompts)
    lora = [params(names[i % len(names)]) for i in range(len(prompts))]
    print(f"workload: {len(prompts)} prompts, {len(prompts) * args.max_tokens} output tokens, {args.adapters} "
          f"adapters of rank {args.rank} (q,k,v,o,gate,up,down), torch threads {torch.get_num_threads()}")
    llm.generate(prompts[:4], lora[:4], use_tqdm=False)  # warm-up; makes every adapter resident
    llm.generate(prompts[4:8], lora[4:8], use_tqdm=False)
    best_base = best_lora = 0.0
    for _ in range(args.rounds):
        tps, base_out = timed(llm, prompts, base)
        best_base = max(best_base, tps)
        tps, lora_out = timed(llm, prompts, lora)
        best_lora = max(best_lora, tps)
    differ = sum(a != b for a, b in zip(base_out, lora_out))
    assert differ > len(prompts) // 2, f"adapters changed only {differ} of {len(prompts)} outputs"
    print(f"base model only:           {best_base:8.1f} output tok/s")
    print(f"{args.adapters} adapters, one batch:    {best_lora:8.1f} output tok/s")
    print(f"ratio multi-LoRA / base:   {best_lora / best_base:8.2f}  (target >= 0.7; "
          f"adapters changed {differ}/{len(prompts)} outputs)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Chunked prefill: how long a running stream waits when a long prompt arrives.

One greedy stream decodes; after its 8th token a prompt of ``--prompt-tokens`` tokens arrives.
For each maxPrefillTokens value, in one run on the same engine settings, prints the stream's
inter-token latency p50 and the longest gap (the step that carried the long prompt's prefill), and
the long prompt's time to first token. Without chunking the longest gap is the whole prefill; with
a budget of B tokens it is about one B-token chunk.

    .venv/bin/python tools/bench_chunked.py --budgets 8192 512 256
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mindie_service import LLM, SamplingParams  # noqa: E402
from mindie_service.devkit.presets import build_demo_model  # noqa: E402
from mindie_service.engine.contract import EngineRequest  # noqa: E402
from tests.prompts import word_prompts  # noqa: E402


def run(model: str, budget: int, prompt_tokens: int) -> tuple[float, float, float]:
    llm = LLM(model, dtype="float32", cache_block_size=16, max_seq_len=4096, max_input_token_len=4000,
              max_prefill_tokens=budget, max_batch_size=8, num_kv_blocks=600)
    eng = llm.engine
    long_ids = llm.tokenizer(" ".join(word_prompts(4, 900, 900, seed=5))).input_ids[:prompt_tokens]
    assert len(long_ids) == prompt_tokens
    warm = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    llm.generate(["warm up the kernels " * 40], warm, use_tqdm=False)
    eng.add_request(EngineRequest("stream", tuple(llm.tokenizer("River mountain city").input_ids),
                                  SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)))
    stamps: list[float] = []
    long_added = long_first = 0.0
    while eng.has_work():
        for ev in eng.step():
            now = time.perf_counter()
            if ev.request_id == "stream":
                stamps.append(now)
                if len(stamps) == 8:
                    eng.add_request(EngineRequest("long", tuple(long_ids),
                                                  SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)))
                    long_added = now
            elif ev.request_id == "long" and not long_first:
                long_first = now
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return statistics.median(gaps) * 1e3, max(gaps) * 1e3, (long_first - long_added) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models" / "small"))
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--budgets", type=int, nargs="+", default=[8192, 512, 256])
    args = ap.parse_args()
    build_demo_model("small", args.model, if_missing=True)
    print(f"long prompt {args.prompt_tokens} tokens arriving beside one stream")
    print(f"{'maxPrefillTokens':>16} {'stream ITL p50 ms':>18} {'longest gap ms':>15} {'long TTFT ms':>13}")
    for b in args.budgets:
        p50, worst, ttft = run(args.model, b, args.prompt_tokens)
        print(f"{b:>16} {p50:>18.1f} {worst:>15.1f} {ttft:>13.1f}", flush=True)


if __name__ == "__main__":
    main()

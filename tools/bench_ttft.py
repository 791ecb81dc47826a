#!/usr/bin/env python3
"""Time to first token under concurrency, per step token budget (ScheduleConfig.maxPrefillTokens).

N prompts of about ``--prompt-tokens`` tokens each (real English, distinct, no shared prefix) arrive at once at an
engine serving the shipped model as ``make serve`` does (SmolLM2-135M's Q4_1 .gguf, packed; fp32 activations).
For each budget and each N in ``--concurrency``, in one run, prints the TTFT p50 / p90 / max over the N prompts,
the time until the last prompt's first token, and the prefill rate (prompt tokens / that time). With one budget
large enough for all prompts, every prompt gets its first token after the whole queue is prefilled; a budget of
B tokens lets prompt k's first token wait only for the prompts ahead of it. The default is the smallest budget
whose prefill rate stays within 5% of the largest one's (printed at the end).

    PYTHONPATH=$PWD .venv/bin/python tools/bench_ttft.py [--budgets 8192 2048 1024 512 256] [--concurrency 1 4 16]
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
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

from mindie_service import LLM, SamplingParams  # noqa: E402
from mindie_service.engine.contract import EngineRequest  # noqa: E402


def prompts(llm: LLM, n: int, size: int) -> list[tuple[int, ...]]:
    text = (ROOT / "tests" / "real" / "real_text.txt").read_text(encoding="utf-8")
    ids = llm.tokenizer(text + " " + text + " " + text).input_ids
    step = max(1, (len(ids) - size) // max(n, 1))
    out = [tuple(ids[i * step:i * step + size]) for i in range(n)]
    assert all(len(p) == size for p in out), "real_text.txt is too short for these prompts"
    return out


def one_round(llm: LLM, batch: list[tuple[int, ...]], tag: str) -> tuple[list[float], float]:
    """TTFT of each prompt (seconds, in arrival order) and the time to the last first token."""
    eng = llm.engine
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    for k, ids in enumerate(batch):
        eng.add_request(EngineRequest(f"{tag}-{k}", ids, params))
    first: dict[str, float] = {}
    while eng.has_work():
        for ev in eng.step():
            first.setdefault(ev.request_id, time.perf_counter() - t0)
    ttfts = [first[f"{tag}-{k}"] for k in range(len(batch))]
    return ttfts, max(ttfts)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="a .gguf or checkpoint folder (default: the shipped SmolLM2 Q4_1)")
    ap.add_argument("--budgets", type=int, nargs="+", default=[8192, 2048, 1024, 512, 256])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--prompt-tokens", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=2, help="rounds per cell (the best round's figures are kept)")
    args = ap.parse_args()
    import torch
    from bench_gguf_files import shipped_gguf
    model = args.model or str(shipped_gguf())
    print(f"{model}: {args.prompt_tokens}-token prompts, {torch.get_num_threads()} threads, "
          f"load average at the start {os.getloadavg()[0]:.2f}", flush=True)
    print(f"{'budget':>7} {'N':>3} {'p50 s':>7} {'p90 s':>7} {'max s':>7} {'prefill tok/s':>14}")
    rates: dict[int, float] = {}
    for budget in args.budgets:
        llm = LLM(model, cache_block_size=16, max_seq_len=2048, max_batch_size=max(args.concurrency),
                  max_prefill_tokens=budget, max_prefill_batch_size=max(args.concurrency), num_kv_blocks=800,
                  enable_prefix_caching=False)
        one_round(llm, prompts(llm, 2, args.prompt_tokens), "warm")
        for n in args.concurrency:
            batch = prompts(llm, n, args.prompt_tokens)
            best = min((one_round(llm, batch, f"b{budget}n{n}r{r}") for r in range(args.repeats)),
                       key=lambda x: x[1])
            ttfts, last = best
            rate = n * args.prompt_tokens / last
            if n == max(args.concurrency):
                rates[budget] = rate
            print(f"{budget:>7} {n:>3} {statistics.median(ttfts):>7.2f} {pct(ttfts, 0.9):>7.2f} {max(ttfts):>7.2f} "
                  f"{rate:>14.0f}", flush=True)
        del llm
    top = max(rates.values())
    chosen = min(b for b, r in rates.items() if r >= 0.95 * top)
    print(f"smallest budget within 5% of the best prefill rate at N={max(args.concurrency)}: {chosen}")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

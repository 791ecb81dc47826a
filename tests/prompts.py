"""Deterministic prompts for engine tests."""
from __future__ import annotations

import random
import time
from typing import Any

WORDS = ("river mountain city garden teacher window morning silver quiet market engine story "
         "harbor lantern winter bridge orange violin forest letter museum thunder candle meadow "
         "pilot ocean castle rabbit desert island planet doctor kitchen mirror").split()


def word_prompts(n: int, lo: int, hi: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lengths = [lo + (hi - lo) * i // max(1, n - 1) for i in range(n)]
    rng.shuffle(lengths)
    return [" ".join(rng.choice(WORDS) for _ in range(k)).capitalize() for k in lengths]


def bench_workload(n: int, seed: int) -> tuple[list[str], list[int]]:
    """The engine benchmarks' workload: ``n`` prompts of 16-256 words and their output lengths, 16-128."""
    rng = random.Random(seed)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(16, 256))) for _ in range(n)]
    return prompts, [rng.randint(16, 128) for _ in range(n)]


def engine_tok_s(llm: Any, prompts: list[Any], outs: list[int]) -> float:
    """Output tok/s of an offline ``LLM`` on a workload (greedy, EOS ignored, exactly ``outs`` tokens each),
    after a warm-up on two other prompts: the timed ones must not find their prefix cached."""
    from mindie_service import SamplingParams

    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in outs]
    warm, _ = bench_workload(2, seed=-1)
    llm.generate(warm, params[:2], use_tqdm=False)
    t = time.perf_counter()
    res = llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t
    assert [len(r.outputs[0].token_ids) for r in res] == outs
    return sum(outs) / dt


def parity_prompts() -> list[str]:
    """The 16-prompt parity set (speculative decoding on vs off, and other exactness checks): twelve word
    prompts of 3-40 words and four that repeat themselves (n-gram drafts find matches in them)."""
    twice = [f"{p} {p}" for p in word_prompts(4, 5, 20, seed=22)]
    return word_prompts(12, 3, 40, seed=21) + twice

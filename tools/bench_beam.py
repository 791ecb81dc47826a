#!/usr/bin/env python3
"""Beam search throughput against transformers, measured in one run on the same weights and prompts.

N prompts of 16-128 words, num_beams=4, length_penalty 1.0, max_new_tokens M, fp32. Our engine runs
all prompts at once (their beams share the continuous batch); transformers runs generate(num_beams=4)
one prompt at a time. Both count the tokens of the returned (best) sequence. Also checks the two
return the same tokens. Rounds (--rounds) alternate the two, each keeps its best.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from mindie_service import LLM, SamplingParams  # noqa: E402
from mindie_service.devkit.presets import build_demo_model  # noqa: E402
from tests.prompts import WORDS  # noqa: E402

BEAMS = 4


def workload(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(16, 128))) for _ in range(n)]


def bench_engine(model: str, prompts: list[str], new: int) -> tuple[float, list[list[int]]]:
    llm = LLM(model, dtype="float32", max_batch_size=BEAMS * len(prompts), cache_block_size=16)
    params = SamplingParams(max_tokens=new, temperature=0.0, num_beams=BEAMS, length_penalty=1.0)
    llm.generate(workload(1, seed=-1), params, use_tqdm=False)  # warm-up on another prompt
    t = time.perf_counter()
    res = llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t
    toks = [r.outputs[0].token_ids for r in res]
    return sum(map(len, toks)) / dt, toks


def bench_hf(model: str, prompts: list[str], new: int) -> tuple[float, list[list[int]]]:
    tok = AutoTokenizer.from_pretrained(model)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    out: list[list[int]] = []
    with torch.inference_mode():
        ids = tok(prompts[0], return_tensors="pt").input_ids
        hf.generate(ids, max_new_tokens=4, num_beams=BEAMS, do_sample=False, pad_token_id=pad)  # warm-up
        t = time.perf_counter()
        for p in prompts:
            ids = tok(p, return_tensors="pt").input_ids
            g = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, num_beams=BEAMS,
                            length_penalty=1.0, do_sample=False, pad_token_id=pad)
            out.append(g[0, ids.shape[1]:].tolist())
        dt = time.perf_counter() - t
    return sum(map(len, out)) / dt, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    model = str(ROOT / "models" / a.preset)
    build_demo_model(a.preset, model, if_missing=True)
    prompts = workload(a.prompts, seed=5)
    best_ours = best_hf = 0.0
    same = True
    for _ in range(a.rounds):
        ours, ot = bench_engine(model, prompts, a.new_tokens)
        ref, ht = bench_hf(model, prompts, a.new_tokens)
        best_ours, best_hf = max(best_ours, ours), max(best_hf, ref)
        same = same and ot == ht
    print(f"beam search k={BEAMS}, {a.prompts} prompts, {a.new_tokens} new tokens, preset {a.preset}, "
          f"torch threads {torch.get_num_threads()}")
    print(f"  engine (all prompts at once): {best_ours:8.1f} tok/s")
    print(f"  transformers (one at a time): {best_hf:8.1f} tok/s")
    print(f"  ratio: {best_ours / best_hf:.2f}x; same tokens: {same}")


if __name__ == "__main__":
    main()

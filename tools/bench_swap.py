#!/usr/bin/env python3
"""Swapping preempted requests' K/V to the host pool (ModelConfig.cpuMemSize) against recomputing them,
measured in one run on the same weights, prompts and KV pool.

The engine benchmarks' workload (N prompts of 16-256 words, 16-128 new tokens each, greedy, EOS ignored)
on a KV pool holding about a third of what the batch needs, so the scheduler must preempt. Each mode
prints one line: throughput (generated tokens/s), how many requests were preempted, the tokens the
forward computed per generated token (recompute redoes prompts), and the preempted requests' stall
(their longest gap between two tokens, mean and max). Also checks both modes give the same tokens.
Rounds (--rounds) alternate the modes; each keeps its best throughput.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import AutoTokenizer  # noqa: E402

from mindie_service import LLM, SamplingParams  # noqa: E402
from mindie_service.devkit.presets import build_demo_model  # noqa: E402
from mindie_service.engine.contract import EngineRequest, TokenEvent  # noqa: E402
from tests.prompts import bench_workload  # noqa: E402

BLOCK = 16


@dataclass
class Result:
    tok_s: float
    preempted: int
    swaps: int
    computed_per_token: float
    stall_mean_ms: float
    stall_max_ms: float
    tokens: dict[str, list[int]]


def run(llm: LLM, prompts: list[list[int]], outs: list[int]) -> Result:
    eng = llm.engine
    computed = 0
    real = eng.runner.execute

    def execute(out):  # count every token the forward computes (recompute redoes them)
        nonlocal computed
        computed += out.num_tokens
        return real(out)

    eng.runner.execute = execute
    for i, (ids, n) in enumerate(zip(prompts, outs)):
        eng.add_request(EngineRequest(f"b{i}", tuple(ids), SamplingParams(max_tokens=n, temperature=0.0,
                                                                           ignore_eos=True)))
    seqs = dict(eng.scheduler.seqs)
    last: dict[str, float] = {}
    gap: dict[str, float] = {}
    tokens: dict[str, list[int]] = {rid: [] for rid in seqs}
    swaps0 = eng.scheduler.num_swap_outs
    t0 = time.perf_counter()
    while eng.has_work():
        for ev in eng.step():
            assert isinstance(ev, TokenEvent), ev
            now = time.perf_counter()
            if ev.request_id in last:
                gap[ev.request_id] = max(gap.get(ev.request_id, 0.0), now - last[ev.request_id])
            last[ev.request_id] = now
            tokens[ev.request_id].append(ev.token.id)
    dt = time.perf_counter() - t0
    eng.runner.execute = real
    generated = sum(map(len, tokens.values()))
    hit = [rid for rid, s in seqs.items() if s.num_preemptions > 0]
    stalls = [gap.get(rid, 0.0) * 1e3 for rid in hit] or [0.0]
    return Result(generated / dt, len(hit), eng.scheduler.num_swap_outs - swaps0, computed / generated,
                  statistics.mean(stalls), max(stalls), tokens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny", help="demo model preset (tiny, small)")
    ap.add_argument("-n", type=int, default=32, help="requests")
    ap.add_argument("--pool-share", type=float, default=0.33, help="KV pool as a share of the batch's need")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    model = str(build_demo_model(args.preset, ROOT / "models" / args.preset, if_missing=True))
    tok = AutoTokenizer.from_pretrained(model)
    # A new workload each round (both modes run the same one): no round finds the last one's prefixes cached.
    rounds = []
    for k in range(args.rounds):
        texts, outs = bench_workload(args.n, seed=3 + k)
        rounds.append(([list(tok(t).input_ids) for t in texts], outs))
    prompts, outs = rounds[0]
    need = sum(-(-(len(p) + n) // BLOCK) for p, n in zip(prompts, outs))
    blocks = max(int(need * args.pool_share), max(-(-(len(p) + n) // BLOCK) for ps, os_ in rounds
                                                  for p, n in zip(ps, os_)))
    engines = {mode: LLM(model, cache_block_size=BLOCK, num_kv_blocks=blocks, max_batch_size=args.n,
                         max_seq_len=1024, max_input_token_len=768, max_prefill_tokens=2048,
                         swap_space_gb=gb) for mode, gb in (("recompute", 0.0), ("swap", 4.0))}
    warm, warm_outs = bench_workload(args.n, seed=99)
    for llm in engines.values():  # warm-up (kernels, allocator, the swap pool): a full round of its own
        run(llm, [list(tok(t).input_ids)[:700] for t in warm], warm_outs)
    best: dict[str, Result] = {}
    same = True
    for prompts, outs in rounds:
        got = {mode: run(llm, prompts, outs) for mode, llm in engines.items()}
        same = same and got["swap"].tokens == got["recompute"].tokens
        for mode, r in got.items():
            if mode not in best or r.tok_s > best[mode].tok_s:
                best[mode] = r
    print(f"# {args.preset}, {args.n} requests, KV pool {blocks} blocks of {BLOCK} ({args.pool_share:.0%} of the "
          f"batch's {need}); greedy outputs identical: {'yes' if same else 'NO'}")
    for mode in ("recompute", "swap"):
        r = best[mode]
        print(f"{mode:9s}: {r.tok_s:7.1f} tok/s  preempted {r.preempted:3d} requests ({r.swaps} swap-outs)  "
              f"computed {r.computed_per_token:.2f} tokens per generated token  preempted requests' longest "
              f"stall: mean {r.stall_mean_ms:.0f} ms, max {r.stall_max_ms:.0f} ms")
    print(f"swap/recompute throughput: {best['swap'].tok_s / best['recompute'].tok_s:.2f}x")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Structured output throughput, measured in one run on the small demo model (figures are rough on a shared
CPU: compare the ratios, not the absolute numbers).

1. 32 concurrent streams, half of them constrained by a 7-field JSON Schema, against the same 32 streams
   unconstrained: output tokens per second (goal >= 0.9x), and the mask work's share of the step time.
2. The compile cache's hit rate over that run (one schema, 16 requests).
3. Forced runs on a schema-heavy workload (every stream constrained by a key-heavy schema, greedy): wall time
   with forced runs against the same run without them (the outputs are checked identical).
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

from mindie_service import LLM, SamplingParams  # noqa: E402
from mindie_service.devkit.presets import build_demo_model  # noqa: E402
from mindie_service.structured.backend import StructuredLimits  # noqa: E402
from tests.prompts import WORDS  # noqa: E402

SEVEN = {"type": "object", "additionalProperties": False,
         "required": ["id", "name", "email", "age", "active", "role", "score"],
         "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99999},
                        "name": {"type": "string", "maxLength": 12}, "email": {"type": "string", "maxLength": 16},
                        "age": {"type": "integer", "minimum": 0, "maximum": 120}, "active": {"type": "boolean"},
                        "role": {"enum": ["admin", "editor", "viewer"]},
                        "score": {"type": "integer", "minimum": 0, "maximum": 100}}}
KEY_HEAVY = {"type": "object", "additionalProperties": False,
             "required": [f"field_number_{i}" for i in range(12)],
             "properties": {f"field_number_{i}": {"enum": ["yes", "no"]} for i in range(12)}}


def prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 32))) for _ in range(n)]


class StepClock:
    """Wraps engine.step to sum its time."""

    def __init__(self, engine) -> None:
        self.engine, self.total, self.steps = engine, 0.0, 0
        inner = engine.step

        def step():
            t0 = time.perf_counter()
            try:
                return inner()
            finally:
                self.total += time.perf_counter() - t0
                self.steps += 1
        engine.step = step


def run(llm: LLM, ps: list[str], params: list[SamplingParams]) -> tuple[float, int, list]:
    t0 = time.perf_counter()
    outs = llm.generate(ps, params, use_tqdm=False)
    dt = time.perf_counter() - t0
    return dt, sum(len(o.outputs[0].token_ids) for o in outs), outs


def mixed(model: str, n: int, new: int, rounds: int) -> None:
    """Unconstrained vs half constrained (forced runs on, and off), alternated ``rounds`` times: best of each."""
    ps = prompts(n, 1)
    llms = {on: LLM(model, max_batch_size=n, cache_block_size=16, structured=StructuredLimits(forced_runs=on))
            for on in (True, False)}
    clock = StepClock(llms[True].engine)
    free = SamplingParams(max_tokens=new, temperature=0.8, seed=1)
    cons = SamplingParams(max_tokens=new, temperature=0.8, seed=1, structured_outputs={"json": SEVEN})
    half = [cons if i % 2 == 0 else free for i in range(n)]
    for llm in llms.values():
        run(llm, ps[:4], half[:4])  # warm-up
    best = {"free": 0.0, "half": 0.0, "half_unforced": 0.0, "matched": 0.0}
    g = llms[True].engine.grammar.stats
    share = fill_share = 0.0
    complete = 0
    for _ in range(rounds):
        dt, tok, _ = run(llms[True], ps, [free] * n)
        best["free"] = max(best["free"], tok / dt)
        clock.total, apply0, fill0 = 0.0, g.apply_s, g.fill_s
        dt, tok, outs = run(llms[True], ps, half)
        if tok / dt > best["half"]:
            best["half"] = tok / dt
            share, fill_share = (g.apply_s - apply0) / clock.total, (g.fill_s - fill0) / clock.total
            complete = sum(1 for o, p in zip(outs, half) if p is cons and o.outputs[0].finish_reason != "length")
        dt, tok, _ = run(llms[False], ps, half)
        best["half_unforced"] = max(best["half_unforced"], tok / dt)
        # The same run unconstrained, each stream as long as in the constrained run (the JSON streams end early,
        # and a batch that shrinks runs fewer tokens a step whatever constrains it).
        matched = [SamplingParams(max_tokens=len(o.outputs[0].token_ids), temperature=0.8, seed=1, ignore_eos=True)
                   for o in outs]
        dt, tok, _ = run(llms[True], ps, matched)
        best["matched"] = max(best["matched"], tok / dt)
    print(f"[1] {n} streams, {n // 2} with a 7-field JSON Schema, {new} tokens max, small model (CPU), best of "
          f"{rounds} alternated rounds")
    print(f"    unconstrained           : {best['free']:8.1f} output tok/s (every stream {new} tokens)")
    print(f"    same lengths, free      : {best['matched']:8.1f} output tok/s (each stream as long as below)")
    print(f"    half JSON               : {best['half']:8.1f} output tok/s -> {best['half'] / best['matched']:.2f}x "
          f"of the same run unconstrained (goal >= 0.9x; {complete}/{n // 2} JSON complete), "
          f"{best['half'] / best['free']:.2f}x of the full-length one")
    print(f"    half JSON, forced off   : {best['half_unforced']:8.1f} output tok/s -> "
          f"{best['half_unforced'] / best['matched']:.2f}x")
    print(f"    mask work               : {100 * share:.1f}% of the step time (of it the batched native fill "
          f"{100 * fill_share:.1f}%)")
    st = llms[True].engine.grammar.compiler.stats
    print(f"[2] compile cache : {100 * st.hit_rate:.0f}% hits ({st.hits} hits, {st.misses} misses, "
          f"{st.compile_ms:.1f} ms compiling)")


def forced(model: str, n: int, new: int, rounds: int) -> None:
    ps = prompts(n, 2)
    p = SamplingParams(max_tokens=new, temperature=0.0, structured_outputs={"json": KEY_HEAVY})
    llms = {on: LLM(model, max_batch_size=n, cache_block_size=16, structured=StructuredLimits(forced_runs=on))
            for on in (False, True)}
    clocks = {on: StepClock(llm.engine) for on, llm in llms.items()}
    res: dict[bool, tuple] = {}
    for llm in llms.values():
        run(llm, ps[:2], [p] * 2)  # warm-up
    for _ in range(rounds):
        for on, llm in llms.items():
            clocks[on].steps, f0 = 0, llm.engine.grammar.stats.forced_tokens
            dt, tok, outs = run(llm, ps, [p] * n)
            if on not in res or dt < res[on][0]:
                res[on] = (dt, tok, clocks[on].steps, [o.outputs[0].token_ids for o in outs],
                           llm.engine.grammar.stats.forced_tokens - f0)
    (d0, _, s0, o0, _), (d1, t1, s1, o1, f1) = res[False], res[True]
    print(f"[3] forced runs, {n} greedy streams of a 12-key schema: off {d0:.2f} s / {s0} steps, on {d1:.2f} s / "
          f"{s1} steps -> {d0 / d1:.2f}x faster; {f1} of {t1} tokens forced; outputs identical: {o0 == o1}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models" / "small"))
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    if a.model == str(ROOT / "models" / "small"):
        build_demo_model("small", a.model, if_missing=True)
    mixed(a.model, a.streams, a.max_tokens, a.rounds)
    forced(a.model, a.streams, 2 * a.max_tokens, a.rounds)
    print("(one run on a shared machine: rough figures)")


if __name__ == "__main__":
    main()

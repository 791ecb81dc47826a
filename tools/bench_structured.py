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
                        "score": {"type": "number", "minimum": 0, "maximum": 100}}}
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


def mixed(model: str, n: int, new: int, forced_runs: bool = True) -> tuple[float, float]:
    llm = LLM(model, max_batch_size=n, cache_block_size=16, structured=StructuredLimits(forced_runs=forced_runs))
    clock = StepClock(llm.engine)
    ps = prompts(n, 1)
    free = SamplingParams(max_tokens=new, temperature=0.8, seed=1)
    run(llm, ps[:4], [free] * 4)  # warm-up
    dt0, tok0, _ = run(llm, ps, [free] * n)
    g = llm.engine.grammar.stats
    clock.total, clock.steps = 0.0, 0
    cons = SamplingParams(max_tokens=new, temperature=0.8, seed=1, structured_outputs={"json": SEVEN})
    params = [cons if i % 2 == 0 else free for i in range(n)]
    apply0, fill0 = g.apply_s, g.fill_s
    dt1, tok1, outs = run(llm, ps, params)
    ok = sum(1 for o, p in zip(outs, params) if p is cons and o.outputs[0].finish_reason != "length")
    if not forced_runs:
        return tok0 / dt0, tok1 / dt1
    print(f"[1] {n} streams, {n // 2} with a 7-field JSON Schema, {new} tokens max, small model (CPU)")
    print(f"    unconstrained : {tok0 / dt0:8.1f} output tok/s ({tok0} tokens, {dt0:.2f} s)")
    print(f"    half JSON     : {tok1 / dt1:8.1f} output tok/s ({tok1} tokens, {dt1:.2f} s; {ok}/{n // 2} JSON "
          f"complete)")
    print(f"    ratio         : {(tok1 / dt1) / (tok0 / dt0):.2f}x (goal >= 0.9x)")
    print(f"    mask work     : {100 * (g.apply_s - apply0) / clock.total:.1f}% of the step time (batched fill "
          f"{100 * (g.fill_s - fill0) / clock.total:.1f}%), {g.forced_tokens} forced tokens")
    st = llm.engine.grammar.compiler.stats
    print(f"[2] compile cache : {100 * st.hit_rate:.0f}% hits ({st.hits} hits, {st.misses} misses, "
          f"{st.compile_ms:.1f} ms compiling)")
    return tok0 / dt0, tok1 / dt1


def forced(model: str, n: int, new: int) -> None:
    ps = prompts(n, 2)
    res = {}
    for on in (False, True):
        llm = LLM(model, max_batch_size=n, cache_block_size=16, structured=StructuredLimits(forced_runs=on))
        p = SamplingParams(max_tokens=new, temperature=0.0, structured_outputs={"json": KEY_HEAVY})
        run(llm, ps[:2], [p] * 2)  # warm-up
        clock = StepClock(llm.engine)
        dt, tok, outs = run(llm, ps, [p] * n)
        res[on] = (dt, tok, clock.steps, [o.outputs[0].token_ids for o in outs], llm.engine.grammar.stats.forced_tokens)
    (d0, _, s0, o0, _), (d1, t1, s1, o1, f1) = res[False], res[True]
    print(f"[3] forced runs, {n} greedy streams of a 12-key schema: off {d0:.2f} s / {s0} steps, on {d1:.2f} s / "
          f"{s1} steps -> {d0 / d1:.2f}x faster; {f1} of {t1} tokens forced; outputs identical: {o0 == o1}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models" / "small"))
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    a = ap.parse_args()
    if a.model == str(ROOT / "models" / "small"):
        build_demo_model("small", a.model, if_missing=True)
    mixed(a.model, a.streams, a.max_tokens)
    free, half = mixed(a.model, a.streams, a.max_tokens, forced_runs=False)
    print(f"    without forced runs: {half:.1f} vs {free:.1f} tok/s unconstrained -> {half / free:.2f}x")
    forced(a.model, a.streams, 2 * a.max_tokens)
    print("(one run on a shared machine: rough figures)")


if __name__ == "__main__":
    main()

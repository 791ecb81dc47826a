#!/usr/bin/env python3
"""Structured output throughput on the small demo model, one run (compare the ratios, not the absolute numbers).

1. 32 concurrent streams, half of them constrained by a 7-field JSON Schema, against the same 32 streams
   unconstrained *with the same number of tokens per stream* (EOS ignored, each stream as long as in the
   constrained run): output tokens per second (goal >= 0.9x), by wall time and by this process's CPU time (the
   latter barely moves when other processes share the cores), and the mask work's share of the step time.
   Fair and stable: every engine runs each workload once untimed first (compile, caches, allocator), then the
   workloads alternate round by round and each keeps its best round.
2. The compile cache's hit rate over that run (one schema, every constrained request).
3. Forced runs on a schema-heavy workload (every stream constrained by a 12-key schema, greedy): wall time with
   forced runs against the same run without them (the outputs are checked identical).
4. The mask fill overlapped with the forward (structuredOutput.overlapFill) against filled after it: forced runs
   off, so every constrained row fills in the step; mean step time, outputs checked identical.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from dataclasses import dataclass, field
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
    """Wraps engine.step to sum its time, and the grammar's after-step pass (consume, then forced runs)."""

    def __init__(self, engine) -> None:
        self.engine, self.total, self.steps, self.after = engine, 0.0, 0, 0.0
        inner, after = engine.step, engine.grammar.after_step

        def after_step(*a, **kw):
            t0 = time.perf_counter()
            try:
                return after(*a, **kw)
            finally:
                self.after += time.perf_counter() - t0
        engine.grammar.after_step = after_step

        def step():
            t0 = time.perf_counter()
            try:
                return inner()
            finally:
                self.total += time.perf_counter() - t0
                self.steps += 1
        engine.step = step


@dataclass
class Best:
    """A workload's best round: output tokens per wall second and per CPU second, the step clock's share."""
    tok_s: float = 0.0
    tok_cpu_s: float = 0.0
    tokens: int = 0
    step_s: float = 0.0  # mean step time of the best round
    extra: dict = field(default_factory=dict)


def run(llm: LLM, ps: list[str], params: list[SamplingParams]) -> tuple[float, float, int, list]:
    t0, c0 = time.perf_counter(), time.process_time()
    outs = llm.generate(ps, params, use_tqdm=False)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return dt, cpu, sum(len(o.outputs[0].token_ids) for o in outs), outs


def timed(best: Best, llm: LLM, clock: StepClock, ps: list[str], params: list[SamplingParams]) -> list:
    """One timed round of a workload; keeps it in ``best`` when faster. The grammar stats' deltas go to extra."""
    g = llm.engine.grammar.stats
    clock.total, clock.steps, clock.after, apply0, fill0 = 0.0, 0, 0.0, g.apply_s, g.fill_s
    dt, cpu, tok, outs = run(llm, ps, params)
    best.tok_cpu_s = max(best.tok_cpu_s, tok / cpu)
    if tok / dt > best.tok_s:
        best.tok_s, best.tokens, best.step_s = tok / dt, tok, clock.total / max(clock.steps, 1)
        best.extra = {"apply": (g.apply_s - apply0) / clock.total, "fill": (g.fill_s - fill0) / clock.total,
                      "after": clock.after / clock.total, "steps": clock.steps}
    return outs


def engines(model: str, n: int) -> dict[str, LLM]:
    """forced runs on (the default), off, and off with the fill overlapped with the forward."""
    kw = dict(max_batch_size=n, cache_block_size=16)
    return {"on": LLM(model, **kw, structured=StructuredLimits(forced_runs=True)),
            "off": LLM(model, **kw, structured=StructuredLimits(forced_runs=False)),
            "overlap": LLM(model, **kw, structured=StructuredLimits(forced_runs=False, overlap_fill=True))}


def mixed(llms: dict[str, LLM], clocks: dict[str, StepClock], n: int, new: int, rounds: int) -> None:
    """Half constrained (forced runs on; off; off and overlapped) vs the same lengths unconstrained, alternated."""
    ps = prompts(n, 1)
    free = SamplingParams(max_tokens=new, temperature=0.8, seed=1)
    cons = SamplingParams(max_tokens=new, temperature=0.8, seed=1, structured_outputs={"json": SEVEN})
    half = [cons if i % 2 == 0 else free for i in range(n)]
    # untimed: every engine once over the whole workload; the constrained run fixes each stream's length
    outs = run(llms["on"], ps, half)[3]
    lengths = [len(o.outputs[0].token_ids) for o in outs]
    same = [SamplingParams(max_tokens=k, temperature=0.8, seed=1, ignore_eos=True) for k in lengths]
    for name in ("off", "overlap"):
        run(llms[name], ps, half)
    run(llms["on"], ps, same)
    work = [("free", "on", same), ("half", "on", half), ("half_off", "off", half), ("overlap", "overlap", half)]
    best = {w: Best() for w, _, _ in work}
    same_out: dict[str, list] = {}
    for r in range(rounds):
        for w, e, params in (work if r % 2 == 0 else work[::-1]):
            got = timed(best[w], llms[e], clocks[e], ps, params)
            same_out[w] = [o.outputs[0].token_ids for o in got]
    complete = sum(1 for o, p in zip(outs, half) if p is cons and o.outputs[0].finish_reason != "length")
    f, h, o, v = best["free"], best["half"], best["half_off"], best["overlap"]
    print(f"[1] {n} streams, {n // 2} with a 7-field JSON Schema ({complete}/{n // 2} complete), the other {n // 2} "
          f"free, {new} tokens max, small model (CPU); best of {rounds} alternated rounds after an untimed one")
    print(f"    same lengths, free  : {f.tok_s:8.1f} output tok/s, {f.tok_cpu_s:7.1f} per CPU s ({f.tokens} tokens, "
          f"EOS ignored, each stream as long as in the constrained run)")
    for label, b in (("half JSON           ", h), ("half JSON, forced off", o)):
        print(f"    {label}: {b.tok_s:8.1f} output tok/s -> {b.tok_s / f.tok_s:.2f}x (goal >= 0.9x); per CPU s "
              f"{b.tok_cpu_s:7.1f} -> {b.tok_cpu_s / f.tok_cpu_s:.2f}x ({b.tokens} tokens, {b.extra['steps']} steps "
              f"vs {f.extra['steps']})")
    print(f"    mask work           : masking {100 * h.extra['apply']:.1f}% of the step time, forced off "
          f"{100 * o.extra['apply']:.1f}%; the after-step pass (consume + forcing) {100 * h.extra['after']:.1f}% / "
          f"{100 * o.extra['after']:.1f}%; the batched native fill in all {100 * h.extra['fill']:.1f}% / "
          f"{100 * o.extra['fill']:.1f}%")
    st = llms["on"].engine.grammar.compiler.stats
    print(f"[2] compile cache : {100 * st.hit_rate:.0f}% hits ({st.hits} hits, {st.misses} misses, "
          f"{st.compile_ms:.1f} ms compiling)")
    print(f"[4] fill overlapped with the forward (forced runs off): mean step {1000 * v.step_s:.1f} ms vs "
          f"{1000 * o.step_s:.1f} ms filled after it -> {o.step_s / v.step_s:.2f}x; tok/s {v.tok_s / o.tok_s:.2f}x, "
          f"per CPU s {v.tok_cpu_s / o.tok_cpu_s:.2f}x; outputs identical: {same_out['overlap'] == same_out['half_off']}")


def forced(llms: dict[str, LLM], clocks: dict[str, StepClock], n: int, new: int, rounds: int) -> None:
    ps = prompts(n, 2)
    p = SamplingParams(max_tokens=new, temperature=0.0, structured_outputs={"json": KEY_HEAVY})
    for e in ("off", "on"):
        run(llms[e], ps, [p] * n)  # untimed
    res: dict[str, tuple] = {}
    for r in range(rounds):
        for e in (("off", "on") if r % 2 == 0 else ("on", "off")):
            llm, clock = llms[e], clocks[e]
            clock.steps, f0 = 0, llm.engine.grammar.stats.forced_tokens
            dt, _, tok, outs = run(llm, ps, [p] * n)
            if e not in res or dt < res[e][0]:
                res[e] = (dt, tok, clock.steps, [o.outputs[0].token_ids for o in outs],
                          llm.engine.grammar.stats.forced_tokens - f0)
    (d0, _, s0, o0, _), (d1, t1, s1, o1, f1) = res["off"], res["on"]
    print(f"[3] forced runs, {n} greedy streams of a 12-key schema: off {d0:.2f} s / {s0} steps, on {d1:.2f} s / "
          f"{s1} steps -> {d0 / d1:.2f}x faster; {f1} of {t1} tokens forced; outputs identical: {o0 == o1}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models" / "small"))
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if a.model == str(ROOT / "models" / "small"):
        build_demo_model("small", a.model, if_missing=True)
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    llms = engines(a.model, a.streams)
    clocks = {k: StepClock(llm.engine) for k, llm in llms.items()}
    mixed(llms, clocks, a.streams, a.max_tokens, a.rounds)
    forced(llms, clocks, a.streams, 2 * a.max_tokens, a.rounds)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (on a shared machine trust the "
          f"per-CPU-second ratios more than the wall-time ones)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Where one stream's decode step goes on a GGUF file (issue 44's one-stream goal: >= 85% of the bandwidth bound),
as ratios measured in one run, so that a busy machine moves them less than it moves the times:

- the engine's step (ms) split into the one C call (llama_decode_f32: embedding, every layer, final norm, head) and
  the Python around it (runner, sampler, engine);
- inside the C call, each GEMV kind's share (qkv, o, gate_up, down: every layer's projection of that kind called in
  sequence as the step calls them; head): its ms per step and the GB/s its weight bytes were read at, against a
  STREAM triad (tools/membw.py) measured in the same run, between their rounds. Each kind's pass starts after a read of
  2 x the last-level cache (its weights come from memory, as in a step) and has the cost of an empty call
  (the team's fork and the ctypes call, which the fused step does not pay) taken off;
- the rest of the C call (attention, norms, rotary, the KV writes, the team's barriers) as what is left, and the
  attention kernel alone, timed on the op-by-op path's steps (for scale: that path runs the rows kernel).

    PYTHONPATH=$PWD .venv/bin/python tools/profile_decode.py [--model X.gguf] [--steps 32] [--rounds 5]

A kind far under the triad is compute-bound (its kernel), not memory-bound; llama.cpp reads the same bytes.
Smoke runs only on a shared machine: figures on a quiet one.
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
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

import torch  # noqa: E402

import membw  # noqa: E402
from bench_real import make_llm, shipped_gguf  # noqa: E402
from mindie_service.models import fused_layers  # noqa: E402
from npu_ops import cpu_kernels, gguf_cpu  # noqa: E402
from npu_ops.gguf_modules import STEP_DECODE, GgufLinear  # noqa: E402
from profile_step import Timers, start  # noqa: E402

KINDS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
EVICT_MIB = 64  # a read of this much before each pass: 2x this machine's 32 MiB last-level cache
EMPTY_PASSES = 4  # empty passes a round


@dataclass(frozen=True)
class Pass:
    """One GEMV kind over a step: its calls' ms (the empty call's cost taken off) and weight bytes."""

    kind: str
    ms: float
    nbytes: int
    calls: int

    @property
    def gbs(self) -> float:
        return self.nbytes / (self.ms * 1e-3) / 1e9 if self.ms > 0 else float("inf")


def linears(model: torch.nn.Module) -> dict[str, list[GgufLinear]]:
    """Every packed GGUF linear of each kind, in layer order (the head: a tied one reads the embedding's bytes)."""
    out: dict[str, list[GgufLinear]] = {k: [] for k in KINDS}
    for name, mod in model.named_modules():
        kind = name.rsplit(".", 1)[-1]
        if kind in out and isinstance(mod, GgufLinear) and mod.runs_on_cpu_kernels():
            out[kind].append(mod)
    return {k: v for k, v in out.items() if v}


def pass_seconds(mods: list[GgufLinear], rows: int, threads: int, evict: membw.Probe) -> float:
    """One pass: each module's gguf_linear_f32 on ``rows`` rows of x (0: the empty call) as a decode step's."""
    lib = cpu_kernels.load()
    calls = [(m.segments(), m.in_features, m.out_features, m.bias) for m in mods]
    xs = {k: torch.randn(max(rows, 1), k) for k in {m.in_features for m in mods}}
    ys = {n: torch.empty(max(rows, 1), n) for n in {m.out_features for m in mods}}
    evict.read()
    t = time.perf_counter()
    for segs, k, n, bias in calls:
        lib.gguf_linear_f32(segs.data_ptr(), segs.shape[0] - 1, xs[k].data_ptr(), rows, k,
                            None if bias is None else bias.data_ptr(), ys[n].data_ptr(), n, threads, STEP_DECODE)
    return time.perf_counter() - t


def gemv_passes(kinds: dict[str, list[GgufLinear]], rounds: int, threads: int) -> tuple[list[Pass], float]:
    """Each kind's fastest pass over ``rounds`` (the one a neighbour disturbed least), the fastest empty call's time
    taken off; and the fastest triad pass (GB/s) of the probes run between the rounds, measured as the passes are."""
    evict = membw.Probe(EVICT_MIB * membw.MIB, threads)
    triad = membw.Probe(0, threads, 3 * EVICT_MIB * membw.MIB)
    times: dict[str, list[float]] = {k: [] for k in kinds}
    empty: dict[str, list[float]] = {k: [] for k in kinds}
    triads = [triad.triad()]  # threads awake, pages resident
    for _ in range(rounds):  # kinds interleaved a round: the machine's bandwidth moves over seconds
        for kind, mods in kinds.items():
            times[kind].append(pass_seconds(mods, 1, threads, evict))
            # the empty call's cost is taken off as its fastest of several: one slowed by a neighbour would take
            # off more than the step pays
            empty[kind] += [pass_seconds(mods, 0, threads, evict) for _ in range(EMPTY_PASSES)]
        triads += [triad.triad() for _ in range(3)]
    gbs = triad.triad_bytes / min(triads[1:]) / 1e9
    evict.close()
    triad.close()
    out = []
    for kind, mods in kinds.items():
        ms = (min(times[kind]) - min(empty[kind])) * 1e3
        nbytes = sum(p.data.nbytes for m in mods for p in m.parts)
        out.append(Pass(kind, ms, nbytes, len(mods)))
    return out, gbs


def step_times(llm: object, steps: int) -> tuple[float, float]:
    """ms of the median engine step and of the median step's C call (llama_decode_f32), one sequence decoding:
    medians, so that the steps a neighbour's burst slowed count least."""
    eng = start(llm, [list(range(100, 164))], steps)
    lib, t = cpu_kernels.load(), Timers()
    names = [n for n in ("llama_decode_f32", "llama_decode_steps_f32") if hasattr(lib, n)]
    old = {n: getattr(lib, n) for n in names}
    for n in names:
        setattr(lib, n, t.wrap(n, old[n]))
    totals, calls = [], []
    try:
        for _ in range(steps):
            c0, t0 = sum(t.acc.values()), time.perf_counter()
            eng.step()
            totals.append(time.perf_counter() - t0)
            calls.append(sum(t.acc.values()) - c0)
    finally:
        for n in names:
            setattr(lib, n, old[n])
    return statistics.median(totals) * 1e3, statistics.median(calls) * 1e3


def attention_ms(model_path: str, steps: int) -> float:
    """ms per step in the paged attention kernel, on the op-by-op path (fused layers off) for one sequence."""
    fused_layers.set_enabled(False)
    try:
        llm = make_llm(model_path, None, 2, decode_steps=1)
        eng = start(llm, [list(range(100, 164))], steps)
        lib, t = cpu_kernels.load(), Timers()
        name = "paged_attention_rows_f32"
        old = getattr(lib, name)
        setattr(lib, name, t.wrap(name, old))
        try:
            for _ in range(steps):
                eng.step()
        finally:
            setattr(lib, name, old)
        return t.acc[name] / steps * 1e3
    finally:
        fused_layers.set_enabled(True)


def report(step_ms: float, c_ms: float, passes: list[Pass], attn_ms: float, triad: float) -> str:
    lines = [f"engine step {step_ms:.2f} ms ({1e3 / step_ms:.1f} tok/s): C call {c_ms:.2f} ms ({c_ms / step_ms:.0%}), "
             f"Python between the C calls {step_ms - c_ms:.2f} ms ({(step_ms - c_ms) / step_ms:.0%})",
             f"triad (same run: the fastest pass of the probes between the GEMV passes' rounds) {triad:.1f} GB/s"]
    for p in passes:
        lines.append(f"  {p.kind:<13} {p.calls:3d} calls {p.ms:7.3f} ms ({p.ms / step_ms:4.0%} of the step) "
                     f"{p.nbytes / 1e6:7.1f} MB at {p.gbs:5.1f} GB/s = {p.gbs / triad:4.0%} of triad")
    gemv = sum(p.ms for p in passes)
    nbytes = sum(p.nbytes for p in passes)
    lines.append(f"  GEMVs together {gemv:.2f} ms ({gemv / step_ms:.0%}), {nbytes / 1e6:.1f} MB at "
                 f"{nbytes / gemv / 1e6:.1f} GB/s = {nbytes / gemv / 1e6 / triad:.0%} of triad")
    lines.append(f"  rest of the C call (attention, norms, rotary, KV writes, barriers) {c_ms - gemv:.2f} ms "
                 f"({(c_ms - gemv) / step_ms:.0%}); attention kernel alone (op-by-op path) {attn_ms:.3f} ms")
    bound = nbytes / (triad * 1e9) * 1e3
    lines.append(f"  bandwidth bound (these bytes at the triad) {bound:.2f} ms a token: the step is at "
                 f"{bound / step_ms:.0%} of it ({1e3 / bound:.1f} tok/s)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="threads (default: torch's)")
    ap.add_argument("--no-attention", action="store_true", help="skip the op-by-op attention timing")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    path = args.model or str(shipped_gguf())
    print(f"{path}: {threads} threads, load average {os.getloadavg()[0]:.1f}", flush=True)
    llm = make_llm(path, None, 2, decode_steps=1)
    step_ms, c_ms = step_times(llm, args.steps)
    passes, triad = gemv_passes(linears(llm.engine.runner.model), args.rounds, threads)
    del llm
    attn = 0.0 if args.no_attention else attention_ms(path, args.steps)
    print(report(step_ms, c_ms, passes, attn, triad))
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

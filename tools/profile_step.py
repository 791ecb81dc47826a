#!/usr/bin/env python3
"""Where one decode step's time goes: ms per step split by op (inclusive Python time of each op) and, inside
the ops, the C kernels' own time (each ctypes entry point timed), so that op - kernel = framework time
(Python dispatch, argument marshalling, allocations); step - ops = the engine around the model (scheduling,
input packing, sampling, outputs). Then cProfile's top functions by own time.

    PYTHONPATH=$PWD .venv/bin/python tools/profile_step.py --seqs 32 1 [--quant w8a8] [--model X.gguf] [--op-by-op]

With the fused fp32 layers (one C call per step, mindie_service/models/fused_layers.py) the per-op rows are
empty: "kernel llama_layers_f32" is all the layers; a plain decode step is one call (models/fused_decode.py):
"kernel llama_decode_f32" is the embedding, the layers, the final norm and the head. --op-by-op profiles the
op-by-op path instead.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

import torch  # noqa: E402

from mindie_service import SamplingParams  # noqa: E402
from mindie_service.engine.contract import EngineRequest  # noqa: E402
from mindie_service.engine.sample import sampler as sampler_mod  # noqa: E402
from mindie_service.models import fused_layers, llama as llama_mod  # noqa: E402
from npu_ops import cpu_kernels, linear as linear_mod, quant  # noqa: E402
from bench_real import make_llm, shipped_gguf, workload  # noqa: E402

KERNELS = ("linear_f32", "linear_w8a16_f32", "linear_w8a8_i8", "quantize_rows_i8", "rms_norm_f32", "silu_mul_f32",
           "rotary_f32", "paged_attention_rows_f32", "paged_attention_rows_i8", "linear_w8i16_f32",
           "linear_w8a8_f32", "llama_layers_f32", "llama_decode_f32", "greedy_rows_f32")
OPS = [(llama_mod, "rms_norm"), (llama_mod, "rotary"), (llama_mod, "silu_mul"), (llama_mod, "write_kv"),
       (llama_mod, "paged_attention")]


class Timers:
    def __init__(self) -> None:
        self.acc: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.acc[name] += time.perf_counter() - t
                self.calls[name] += 1
        return timed


def patch(t: Timers, model: Any) -> Callable[[], None]:
    """Time ops, linears, the head, the sampler and every C kernel; returns the undo."""
    undo: list[Callable[[], None]] = []

    def swap(owner: Any, attr: str, name: str) -> None:
        old = getattr(owner, attr)
        setattr(owner, attr, t.wrap(name, old))
        undo.append(lambda: setattr(owner, attr, old))

    lib = cpu_kernels.load()
    for k in KERNELS:
        if lib is not None and hasattr(lib, k):
            swap(lib, k, "kernel " + k)
    for mod, fn in OPS:
        swap(mod, fn, "op " + fn)
    head = model.lm_head
    head.forward = t.wrap("op lm_head", head.forward)
    undo.append(lambda: delattr(head, "forward"))
    swap(quant.QuantLinear, "forward", "op int8 linear")
    swap(linear_mod.FastLinear, "forward", "op fp32 linear")
    swap(sampler_mod.Sampler, "sample", "sampler")
    swap(model, "forward", "model forward")
    return lambda: [u() for u in reversed(undo)]


def start(llm: Any, ids: list[list[int]], steps: int) -> Any:
    eng = llm.engine
    for i, p in enumerate(ids):
        eng.add_request(EngineRequest(f"p{i}", tuple(p[:64]), SamplingParams(max_tokens=3 * steps + 40,
                                                                             temperature=0.0, ignore_eos=True)))
    for _ in range(6):  # prefills done: every sequence decoding
        eng.step()
    return eng


def profile(model: str, quant_scheme: str | None, seqs: int, steps: int, head: str) -> str:
    llm = make_llm(model, quant_scheme, max(seqs, 2), head, decode_steps=1)
    ids, _ = workload(llm.tokenizer, max(seqs, 2), 0)
    eng = start(llm, ids[:seqs], steps)
    t = Timers()
    undo = patch(t, eng.runner.model)
    try:
        t0 = time.perf_counter()
        for _ in range(steps):
            eng.step()
        total = (time.perf_counter() - t0) / steps * 1e3
    finally:
        undo()
    out = io.StringIO()
    out.write(f"decode step of {seqs} sequences, {quant_scheme or 'fp32'}, head {head}: {total:.2f} ms/step "
              f"({seqs / total * 1e3:.0f} tok/s)\n")
    linear_kernels = sum(v for k, v in t.acc.items() if k.startswith("kernel") and ("linear" in k or "quantize" in k
                                                                                     or "head" in k))
    for k in sorted(t.acc, key=lambda k: -t.acc[k]):
        out.write(f"  {k:<34} {t.acc[k] / steps * 1e3:8.3f} ms  {t.calls[k] / steps:6.0f} calls\n")
    ops = sum(v for k, v in t.acc.items() if k.startswith("op")) / steps * 1e3
    kern = sum(v for k, v in t.acc.items() if k.startswith("kernel")) / steps * 1e3
    fwd, head = t.acc["model forward"] / steps * 1e3, t.acc["op lm_head"] / steps * 1e3
    if not fwd:  # every step one C call (models/fused_decode.py): no ops to split
        out.write(f"  = one-call decode steps: C kernels {kern:.2f} ms, Python around them {total - kern:.2f} ms "
                  f"({(total - kern) / total:.0%}: runner, sampler, engine)\n")
    else:
        out.write(f"  = C kernels {kern:.2f} ms (linears {linear_kernels / steps * 1e3:.2f}); framework inside ops "
                  f"{ops - kern:.2f} ms; model forward outside ops {fwd - (ops - head):.2f} ms;"
                  f" engine outside the forward and head {total - fwd - head:.2f} ms\n"
                  f"  = step {total:.2f} ms - C kernels {kern:.2f} ms = framework {total - kern:.2f} ms "
                  f"({(total - kern) / total:.0%}: Python, dispatch, allocations, engine)\n")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        eng.step()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
    out.write("\n".join(line for line in s.getvalue().splitlines() if line.strip())[:6000] + "\n")
    return out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="")
    ap.add_argument("--seqs", type=int, nargs="+", default=[32, 1])
    ap.add_argument("--quant", nargs="*", default=["fp32"])
    ap.add_argument("--head", default="float")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--op-by-op", action="store_true", help="the op-by-op path, not the fused fp32 layers")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: as set); 1 on a loaded machine")
    args = ap.parse_args()
    fused_layers.set_enabled(not args.op_by_op)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = args.model or str(shipped_gguf())
    print(f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}")
    for q in args.quant:
        for n in args.seqs:
            print(profile(model, None if q == "fp32" else q, n, args.steps, args.head), flush=True)


if __name__ == "__main__":
    main()

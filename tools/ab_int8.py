#!/usr/bin/env python3
"""int8 against fp32 (and llama.cpp Q8_0) on the real model, in alternating rounds: every round runs each
engine once on the same workload, so that contention on a shared machine hits them alike; the best round of
each is kept and the ratios are printed with the load average. Workloads are tools/bench_real.py's: batched
(``--prompts`` real-English prompts, 16-128 output tokens, all submitted at once) and one stream (one
100-token prompt, 64 tokens). Engines are held for the whole run (about 0.5-1.5 GB each).

    PYTHONPATH=$PWD .venv/bin/python tools/ab_int8.py --rounds 3 --schemes fp32 w8a8 w8a16 --llama q8_0
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

import torch  # noqa: E402

from bench_real import SCHEMES, make_llm, shipped_gguf, timed_generate, workload  # noqa: E402



def engine_spec(name: str) -> tuple[str | None, str]:
    base, _, head = name.partition("+")
    return SCHEMES[base], "int8" if head else "float"


def llama_round(args: argparse.Namespace, kind: str, work: dict, slots: list[int]) -> float:
    gguf = Path(args.gguf_dir) / f"smollm2-135m-{kind}.gguf"
    proc = subprocess.run([args.llama_python, str(ROOT / "tools" / "llamacpp_harness.py"), str(gguf), "--threads",
                           str(torch.get_num_threads()), "--slots", *map(str, slots)],
                          input=json.dumps(work), text=True, capture_output=True, check=True)
    return max(json.loads(line)["tok_s"] for line in proc.stdout.splitlines() if line.startswith("{"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--schemes", nargs="+", default=["fp32", "w8a8"], help="fp32 | w8a16 | w8a8 (+int8head)")
    ap.add_argument("--llama", nargs="*", default=[], help="llama.cpp types, e.g. q8_0 f32")
    ap.add_argument("--mode", choices=["batched", "stream"], default="batched")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--slots", type=int, default=16, help="llama.cpp slots for the batched workload")
    ap.add_argument("--llama-python", default="/work/peers/venv/bin/python")
    ap.add_argument("--gguf-dir", default="/work/peers/gguf")
    ap.add_argument("--threads", type=int, default=0, help="0: torch's default (2 here); 1 is steadier when loaded")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = str(shipped_gguf())
    probe = make_llm(model, None, 2, decode_steps=1)
    ids, outs = workload(probe.tokenizer, args.prompts, 0)
    del probe
    if args.mode == "stream":
        ids, outs = [ids[1][:100]], [64]
    batch = len(ids)
    llms = {}
    for name in args.schemes:
        q, head = engine_spec(name)
        llms[name] = make_llm(model, q, batch, head, decode_steps=1)
        timed_generate(llms[name], [ids[0][:20]], [4])  # warm-up
    work = {"prompts": ids, "outs": outs}
    best: dict[str, float] = {}
    print(f"{args.mode}: {len(ids)} prompts, {sum(outs)} output tokens, {torch.get_num_threads()} threads; "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    for r in range(args.rounds):
        for name, llm in llms.items():
            best[name] = max(best.get(name, 0.0), sum(outs) / timed_generate(llm, ids, outs))
        for kind in args.llama:
            slots = [1] if args.mode == "stream" else [args.slots]
            best[f"llama.cpp {kind}"] = max(best.get(f"llama.cpp {kind}", 0.0), llama_round(args, kind, work, slots))
        print(f"round {r} load {os.getloadavg()[0]:.1f}: " + ", ".join(f"{k} {v:.1f}" for k, v in best.items()),
              flush=True)
    base = best.get("fp32")
    for name, v in best.items():
        vs = [f"{v / base:.2f}x fp32" if base else ""]
        if "q8_0" not in name and "llama.cpp q8_0" in best and name != "fp32":
            vs.append(f"{v / best['llama.cpp q8_0']:.2f}x llama.cpp q8_0")
        print(f"  {name:18} {v:7.1f} tok/s  " + "  ".join(s for s in vs if s))


if __name__ == "__main__":
    main()

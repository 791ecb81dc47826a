#!/usr/bin/env python3
"""One stream, interleaved A/B (rounds alternate between engines so contention hits all alike): best tok/s of
64 tokens after a 100-token real-English prompt, fp32 / w8a8 / w8a8 and w8a16 with the int8 LM head.

    PYTHONPATH=$PWD .venv/bin/python tools/ab_stream.py [ROUNDS]
"""
import sys, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]
from bench_real import make_llm, shipped_gguf, workload, timed_generate
model = str(shipped_gguf())
probe = make_llm(model, None, 2); ids, _ = workload(probe.tokenizer, 8, 0); del probe
cfgs = {"fp32": (None, "float"), "w8a8": ("w8a8", "float"), "w8a8+int8head": ("w8a8", "int8"), "w8a16+int8head": ("w8a16", "int8")}
llms = {k: make_llm(model, q, 1, h) for k, (q, h) in cfgs.items()}
best = {k: 0.0 for k in cfgs}
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    for k, llm in llms.items():
        dt = timed_generate(llm, [ids[1 + r % 4][:100]], [64])
        best[k] = max(best[k], 64 / dt)
    print(r, {k: round(v, 1) for k, v in best.items()}, flush=True)

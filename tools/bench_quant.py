#!/usr/bin/env python3
"""Quantized engine throughput against llama.cpp Q8_0, measured in one run on the same weights.

The demo ``small`` model; 32 prompts of 16-256 words, 16-128 new tokens each (EOS ignored), the same
token ids fed to both. Prints output tokens/s of our engine in fp32, w8a16, w8a8 and w8a8 + int8 KV
(all 32 submitted at once; best of --rounds) and of llama.cpp Q8_0 (converted with llama.cpp's own
converter; continuous batching, best of 8/16/32 slots; tools/llamacpp_harness.py in llama-cpp-python's
venv), the ratios, the time split of a 32-sequence decode step per scheme, and KV bytes per token.

llama.cpp lives outside the repo (see /work/shared/PEERS.md): --llama-python is that venv's python,
--llama-src the unpacked llama-cpp-python sdist (for vendor/llama.cpp/convert_hf_to_gguf.py).

    .venv/bin/python tools/bench_quant.py --llama-python /work/peers/llama-venv/bin/python \\
        --llama-src /work/peers/src/llama_cpp_python-0.3.36
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mindie_service import LLM, SamplingParams  # noqa: E402
from mindie_service.devkit.presets import build_demo_model  # noqa: E402
from mindie_service.engine.runner.model_runner import kv_bytes_per_block  # noqa: E402
from mindie_service.engine.contract import EngineRequest  # noqa: E402
from mindie_service.models import llama as llama_mod  # noqa: E402
from npu_ops import linear as linear_mod, quant  # noqa: E402
from tests.prompts import bench_workload as workload, engine_tok_s  # noqa: E402

SCHEMES = (("fp32", None, "auto"), ("w8a16", "w8a16", "auto"), ("w8a8", "w8a8", "auto"),
           ("w8a8+int8kv", "w8a8", "int8"))

# Run with our python (the converter needs torch) with the llama venv's packages (sentencepiece, ...) after ours.
CONVERT = """
import sys
sys.path.append(sys.argv.pop(1))
src = sys.argv.pop(1)
sys.path[:0] = [src, src + "/gguf-py"]
import convert_hf_to_gguf as c
# Our demo tokenizer uses GPT-2's byte-level pre-tokenizer regex, unknown to the converter by hash.
for mod in [m for n, m in list(sys.modules.items()) if n.startswith(("convert_hf_to_gguf", "conversion"))]:
    for cls in list(vars(mod).values()):
        if isinstance(cls, type) and "get_vocab_base_pre" in vars(cls):
            def patched(self, tokenizer, _orig=cls.get_vocab_base_pre):
                try:
                    return _orig(self, tokenizer)
                except NotImplementedError:
                    return "gpt-2"
            cls.get_vocab_base_pre = patched
c.main()
"""


def make_llm(model: str, q: str | None, kv: str, batch: int) -> LLM:
    return LLM(model, dtype="float32", max_batch_size=batch, cache_block_size=16, quantization=q, kv_cache_dtype=kv)


def bench_ours(model: str, q: str | None, kv: str, ids: list[list[int]], outs: list[int]) -> float:
    return engine_tok_s(make_llm(model, q, kv, len(ids)), ids, outs)  # a new engine per run: no prefix cache


def decode_split(model: str, q: str | None, kv: str, ids: list[list[int]], steps: int = 20) -> dict[str, float]:
    """ms per decode step of len(ids) sequences: linears (int8 or fp32), the output head, attention, rest."""
    llm = make_llm(model, q, kv, len(ids))
    eng = llm.engine
    for i, p in enumerate(ids):
        eng.add_request(EngineRequest(f"d{i}", tuple(p[:64]), SamplingParams(max_tokens=steps + 40, temperature=0.0,
                                                                              ignore_eos=True)))
    for _ in range(8):  # prefills done, every sequence decoding
        eng.step()
    acc: dict[str, float] = defaultdict(float)

    def timed(name: str, fn):  # type: ignore[no-untyped-def]
        def wrap(*a, **kw):  # type: ignore[no-untyped-def]
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                acc[name] += time.perf_counter() - t
        return wrap

    saved = (quant.QuantLinear.forward, linear_mod.FastLinear.forward, llama_mod.paged_attention)
    lm_head = eng.runner.model.lm_head
    lm_head.forward = timed("lm_head", lm_head.forward)  # type: ignore[method-assign]  # before the class patch
    quant.QuantLinear.forward = timed("int8 linears", saved[0])  # type: ignore[method-assign]
    linear_mod.FastLinear.forward = timed("fp32 linears", saved[1])  # type: ignore[method-assign]
    llama_mod.paged_attention = timed("attention", saved[2])
    try:
        t = time.perf_counter()
        for _ in range(steps):
            eng.step()
        total = time.perf_counter() - t
    finally:
        quant.QuantLinear.forward, linear_mod.FastLinear.forward, llama_mod.paged_attention = saved  # type: ignore
        del lm_head.forward
    out = {k: v / steps * 1e3 for k, v in acc.items() if v > 0}
    out["other"] = total / steps * 1e3 - sum(out.values())
    out["step"] = total / steps * 1e3
    return out


def llamacpp(args: argparse.Namespace, model: str, ids: list[list[int]], outs: list[int]) -> dict[str, float]:
    res: dict[str, float] = {}
    work = json.dumps({"prompts": ids, "outs": outs})
    for outtype in args.llama_types:
        gguf = Path(args.gguf_dir) / f"small-{outtype}.gguf"
        if not gguf.exists():
            gguf.parent.mkdir(parents=True, exist_ok=True)
            site = subprocess.run([args.llama_python, "-c", "import site; print(site.getsitepackages()[0])"],
                                  check=True, capture_output=True, text=True).stdout.strip()
            subprocess.run([sys.executable, "-c", CONVERT, site, f"{args.llama_src}/vendor/llama.cpp", model,
                            "--outtype", outtype, "--outfile", str(gguf)], check=True, capture_output=True)
        env = dict(os.environ)
        if args.llama_lib:  # libllama built apart: the sdist's bindings over it
            env.update(LLAMA_CPP_LIB_PATH=args.llama_lib, PYTHONPATH=args.llama_src)
        proc = subprocess.run([args.llama_python, str(ROOT / "tools" / "llamacpp_harness.py"), str(gguf),
                               "--threads", str(torch.get_num_threads()), "--slots", *map(str, args.slots)],
                              input=work, text=True, capture_output=True, check=True, env=env)
        rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        best = max(rows, key=lambda r: r["tok_s"])
        res[f"llama.cpp {outtype}"] = best["tok_s"]
        print(f"  llama.cpp {outtype}: " + ", ".join(f"P={r['slots']} {r['tok_s']:.0f}" for r in rows), flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models" / "small"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--llama-python", default="/work/peers/llama-venv/bin/python")
    ap.add_argument("--llama-src", default="/work/peers/src/llama_cpp_python-0.3.36")
    ap.add_argument("--llama-types", nargs="*", default=["q8_0"], help="converter --outtype values (q8_0, f32)")
    ap.add_argument("--gguf-dir", default="/work/peers/gguf")
    ap.add_argument("--llama-lib", default="", help="folder of libllama.so when llama_cpp is not pip-installed")
    ap.add_argument("--slots", type=int, nargs="+", default=[8, 16, 32])
    args = ap.parse_args()
    if args.model == str(ROOT / "models" / "small"):
        build_demo_model("small", args.model, if_missing=True)
    prompts, outs = workload(args.prompts, args.seed)
    tok = make_llm(args.model, None, "auto", 2).tokenizer
    ids = [tok(p).input_ids for p in prompts]
    best: dict[str, float] = {}
    for r in range(args.rounds):
        for name, q, kv in SCHEMES:
            tps = bench_ours(args.model, q, kv, ids, outs)
            best[name] = max(best.get(name, 0.0), tps)
            print(f"round {r + 1}: {name} {tps:.0f} tok/s", flush=True)
    if Path(args.llama_python).exists():
        best.update(llamacpp(args, args.model, ids, outs))
    else:
        print(f"llama.cpp skipped: no {args.llama_python}")
    print(f"\noutput tok/s, {sum(outs)} tokens, {torch.get_num_threads()} threads (best of {args.rounds} rounds)")
    ref = best.get("llama.cpp q8_0")
    for name, v in best.items():
        extra = f"  {v / ref:.2f}x llama.cpp Q8_0" if ref else ""
        print(f"  {name:<16} {v:8.0f}  {v / best['fp32']:.2f}x fp32{extra}")
    print(f"\ndecode step of {len(ids)} sequences, ms (time split)")
    for name, q, kv in SCHEMES:
        split = decode_split(args.model, q, kv, ids)
        print(f"  {name:<12} " + "  ".join(f"{k} {v:.2f}" for k, v in split.items()))
    llm = make_llm(args.model, None, "auto", 2)
    per_tok = {kv: kv_bytes_per_block(llm.engine.model, 1, torch.float32, kv) for kv in ("auto", "int8")}
    print("\nKV bytes per token: " + ", ".join(f"{'fp32' if k == 'auto' else k} {v}" for k, v in per_tok.items()))
    print("2k-token sequences in a 1 GiB pool: " + ", ".join(
        f"{'fp32' if k == 'auto' else k} {2**30 // (v * 2048)}" for k, v in per_tok.items()))


if __name__ == "__main__":
    main()

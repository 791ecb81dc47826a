#!/usr/bin/env python3
"""Quantized GGUF files at real sizes, both engines on the same file, in one run (issue 44's "Speed and memory").

Random Llama checkpoints in SmolLM2-360M's and SmolLM2-1.7B's shapes with SmolLM2's own tokenizer, converted by
llama.cpp's converter and quantized by its quantizer to Q4_0, Q4_K_M and Q8_0 (tools/bench_gguf_files.py; made once
into --cache), plus the shipped SmolLM2-135M Q4_1 file. For each file, our engine (the public ``LLM`` on the .gguf,
in a process of its own; whatever it does with the quantized tensors, dequantized or packed) and llama.cpp
(tools/llamacpp_harness.py in llama-cpp-python's own venv, built on first use or --llama-venv) measure:
- one stream: 128 tokens after a 64-token prompt (decode tok/s: the tokens after the first over the time from the
  first to the last), with the bandwidth bound beside it: a STREAM triad (tools/membw.py) measured just before /
  the bytes of weights one token reads (every tensor of the file; the embedding only as the tied head);
- 16 and 32 streams: that many 64-token prompts, 128 tokens each, submitted at once (llama.cpp: continuous
  batching through its low-level API, the best of 8/16/32 slots up to the stream count);
- prefill: the time to the first token of a 512-token prompt;
- resident memory after load, and at the end (every weight touched; llama.cpp mmaps the file).
Our fp32 and W8A8 on the safetensors checkpoint of each shape are rows of their own (ours only), so the table shows
what the quantized files buy. Real prompts (tests/real/real_text.txt windows), greedy, EOS ignored,
``torch.get_num_threads()`` threads for both. Measure on a quiet machine; the load average is printed.

    PYTHONPATH=$PWD .venv/bin/python tools/bench_gguf.py [--shapes 360m 1.7b] [--types Q4_0 Q4_K_M Q8_0]
    PYTHONPATH=$PWD .venv/bin/python tools/bench_gguf.py --smoke        # a tiny shape, few tokens: the parts work
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

import bench_gguf_files as files  # noqa: E402
import membw  # noqa: E402


def rss_bytes() -> int:
    for line in open("/proc/self/status", encoding="ascii"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def workload(tokenizer_dir: Path, sizes: dict[str, int]) -> dict[str, Any]:
    """Token ids cut from real English at distinct offsets (no prompt is a prefix of another): one stream's prompt,
    the streams' prompts, the prefill prompt."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    text = (ROOT / "tests" / "real" / "real_text.txt").read_text(encoding="utf-8")
    ids = tok(text + " " + text).input_ids
    n, p = sizes["max_streams"], sizes["prompt"]
    step = max(1, (len(ids) - sizes["prefill"] - 1) // (n + 2))
    cut = [ids[i * step + i:i * step + i + p] for i in range(n + 1)]
    return {"stream": cut[0], "streams": cut[1:], "prefill_ids": ids[-sizes["prefill"] - 1:-1], **sizes}


def ours_side(model: str, quant: str | None, work: dict[str, Any]) -> dict[str, Any]:
    """Our engine on one model in this (fresh) process: load, RSS, one stream, N streams, a prefill."""
    import torch
    from mindie_service import LLM, SamplingParams
    from bench_real import timed_generate, weight_bytes
    rss0, t = rss_bytes(), time.perf_counter()
    llm = LLM(model, dtype="float32", max_batch_size=work["max_streams"], cache_block_size=16, quantization=quant,
              max_seq_len=max(work["prefill"], work["prompt"] + work["out"]) + 16)
    row: dict[str, Any] = {"load_s": time.perf_counter() - t, "rss_load": rss_bytes(), "rss_start": rss0,
                           "threads": torch.get_num_threads(), "weight_bytes_engine": weight_bytes(llm)}
    timed_generate(llm, [work["streams"][-1][:8]], [2])  # warm-up: threads, kernels
    dt, decode_s, decoded = timed_generate(llm, [work["stream"]], [work["out"]])
    row.update(stream=work["out"] / dt, decode=decoded / decode_s)
    for n in work["stream_counts"]:
        dt = timed_generate(llm, work["streams"][:n], [work["out"]] * n)[0]
        row[f"streams_{n}"] = n * work["out"] / dt
    t = time.perf_counter()
    llm.generate([work["prefill_ids"]], [SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)], use_tqdm=False)
    row["prefill_s"] = time.perf_counter() - t
    row["rss_end"] = rss_bytes()
    return row


def run_ours(model: Path, quant: str | None, work_file: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--ours", str(model), "--quant", quant or "none",
                           "--work", str(work_file)], capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"rc {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def harness(python: Path, gguf: Path, prompts: list[list[int]], outs: list[int], slots: list[int],
            threads: int) -> list[dict[str, Any]]:
    proc = subprocess.run([str(python), str(ROOT / "tools" / "llamacpp_harness.py"), str(gguf), "--threads",
                           str(threads), "--slots", *map(str, slots), "--rss"],
                          input=json.dumps({"prompts": prompts, "outs": outs}), text=True, capture_output=True)
    if proc.returncode != 0:  # llama.cpp logs a lot to stderr: the Python traceback, if any, is the news
        err = proc.stderr[proc.stderr.rfind("Traceback"):] if "Traceback" in proc.stderr else proc.stderr[-1500:]
        raise RuntimeError(f"llama.cpp harness failed on {gguf.name}: {err.strip()}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def run_llama(python: Path, gguf: Path, work: dict[str, Any], threads: int) -> dict[str, Any]:
    """llama.cpp on one file: one stream (and its RSS), N streams at its best slot count, a prefill."""
    rows = harness(python, gguf, [work["stream"]], [work["out"]], [1], threads)
    row: dict[str, Any] = {"stream": rows[0]["tok_s"], "decode": rows[0]["decode_tok_s"], **rows[-1]}
    for n in work["stream_counts"]:
        slots = [p for p in (8, 16, 32) if p <= n] or [n]
        rows = harness(python, gguf, work["streams"][:n], [work["out"]] * n, slots, threads)
        best = max((r for r in rows if "tok_s" in r), key=lambda r: r["tok_s"])
        row[f"streams_{n}"], row[f"slots_{n}"] = best["tok_s"], best["slots"]
    rows = harness(python, gguf, [work["prefill_ids"]], [1], [1], threads)
    row["prefill_s"] = 1.0 / rows[0]["tok_s"]
    return row


def fmt_ratio(a: float | None, b: float | None, higher_better: bool = True) -> str:
    if not a or not b:
        return ""
    return f"{(a / b if higher_better else b / a):.2f}x"


def report(results: list[dict[str, Any]], counts: list[int], prefill: int) -> None:
    """One table: a row per file and engine; ratios ours / llama.cpp (higher is better for ours, prefill too)."""
    head = ["file", "engine", "MB/token", "triad GB/s", "bound tok/s", "1 stream decode tok/s", "of bound",
            *[f"{n} streams tok/s" for n in counts], f"prefill {prefill} s", "RSS load MB", "RSS end MB"]
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in results:
        bound = r["triad"] * 1e9 / r["bytes"] if r.get("bytes") else 0.0
        for eng in ("ours", "llama.cpp"):
            e = r.get(eng)
            if not e:
                continue
            if "error" in e:
                print(f"| {r['file']} | {eng} | error: {' '.join(e['error'].split())[-300:]} |")
                continue
            peer = r.get("llama.cpp") if eng == "ours" else None
            ok_peer = peer is not None and "error" not in peer

            def cell(key: str, unit: str = "", higher: bool = True) -> str:
                v = e.get(key)
                if v is None:
                    return ""
                ratio = fmt_ratio(v, peer.get(key), higher) if ok_peer else ""
                return f"{v:.2f}{unit}" + (f" ({ratio})" if ratio else "")

            streams = [cell(f"streams_{n}") + (f" P={e[f'slots_{n}']}" if f"slots_{n}" in e else "") for n in counts]
            share = f"{e['decode'] / bound:.0%}" if bound and e.get("decode") else ""
            print(f"| {r['file']} | {eng} | {r.get('bytes', 0) / 1e6:.0f} | {r['triad']:.1f} | {bound:.1f} | "
                  f"{cell('decode')} | {share} | " + " | ".join(streams) + f" | {cell('prefill_s', '', False)} | "
                  f"{e.get('rss_load', 0) / 1e6:.0f} | {e.get('rss_end', 0) / 1e6:.0f} |")
    print("\nratios in brackets: ours against llama.cpp on the same file (above 1: ours is better; prefill: its time)")


FULL = {"prompt": 64, "out": 128, "stream_counts": [16, 32], "max_streams": 32, "prefill": 512}
SMOKE = {"prompt": 16, "out": 8, "stream_counts": [2, 4], "max_streams": 4, "prefill": 64}


def measure(name: str, model: Path, quant: str | None, work: dict[str, Any], work_file: Path,
            llama: Path | None, threads: int, triad_mib: int) -> dict[str, Any]:
    """One file (or checkpoint) by both engines (llama: None for ours only), the triad taken just before."""
    row: dict[str, Any] = {"file": name, "triad": membw.triad(mib=triad_mib, reps=10, threads=threads).median}
    row["ours"] = run_ours(model, quant, work_file)
    if model.suffix == ".gguf":
        row["bytes"] = files.weight_bytes_per_token(model)
    else:  # a float checkpoint run by our engine alone: the bytes its linears and head read
        row["bytes"] = row["ours"].get("weight_bytes_engine", 0)
    if llama is not None and model.suffix == ".gguf":
        try:
            row["llama.cpp"] = run_llama(llama, model, work, threads)
        except RuntimeError as exc:
            row["llama.cpp"] = {"error": str(exc)}
    print(f"  {name}: " + json.dumps({k: v for k, v in row.items() if k != "file"}, default=str)[:600], flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="*", default=["360m", "1.7b"], choices=[s for s in files.SHAPES if s != "smoke"])
    ap.add_argument("--types", nargs="*", default=["Q4_0", "Q4_K_M", "Q8_0"], choices=list(files.FTYPES))
    ap.add_argument("--float-rows", nargs="*", default=["fp32", "w8a8"], choices=["fp32", "w8a8"],
                    help="ours only, on each shape's safetensors checkpoint")
    ap.add_argument("--no-shipped", action="store_true", help="leave out the shipped SmolLM2-135M Q4_1 file's row")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "mindie_service" / "bench_gguf"))
    ap.add_argument("--llama-venv", default="", help="llama-cpp-python's venv (default: CACHE/llama-venv, built "
                                                     "there on first use)")
    ap.add_argument("--no-llama", action="store_true", help="our engine only")
    ap.add_argument("--smoke", action="store_true", help="a tiny shape and few tokens: check that every part runs")
    ap.add_argument("--ours", default="", help=argparse.SUPPRESS)  # the child process: our engine on one model
    ap.add_argument("--quant", default="none", help=argparse.SUPPRESS)
    ap.add_argument("--work", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ours:
        work = json.loads(Path(args.work).read_text())
        print(json.dumps(ours_side(args.ours, None if args.quant == "none" else args.quant, work)))
        return
    import torch
    threads, cache = torch.get_num_threads(), Path(args.cache)
    shapes, sizes = (["smoke"], SMOKE) if args.smoke else (args.shapes, FULL)
    print(f"{threads} threads; load average at the start {os.getloadavg()[0]:.2f}; cache {cache}", flush=True)
    llama = None if args.no_llama else files.llama_venv(Path(args.llama_venv or cache / "llama-venv"))
    src = files.llama_src(cache, llama) if llama is not None else None
    results: list[dict[str, Any]] = []
    work_file = cache / ("work-smoke.json" if args.smoke else "work.json")
    work: dict[str, Any] = {}
    for shape in shapes:
        folder = files.random_checkpoint(files.SHAPES[shape], cache / f"ckpt-{shape}")
        if not work:
            work = workload(folder, sizes)
            work_file.write_text(json.dumps(work))
        if not args.smoke or shape == shapes[0]:
            for label in args.float_rows:
                results.append(measure(f"{shape} {label} (safetensors)", folder, None if label == "fp32" else label,
                                       work, work_file, None, threads, 32 if args.smoke else 128))
        if src is None:
            continue
        for t, path in files.gguf_files(folder, args.types, src, llama, cache / f"gguf-{shape}").items():
            results.append(measure(f"{shape} {t}", path, None, work, work_file, llama, threads,
                                   32 if args.smoke else 128))
    if not args.no_shipped and work:
        results.append(measure("135m Q4_1 (shipped)", files.shipped_gguf(), None, work, work_file, llama, threads,
                               32 if args.smoke else 128))
    report(results, sizes["stream_counts"], sizes["prefill"])
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

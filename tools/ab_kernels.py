#!/usr/bin/env python3
"""Interleaved A/B of two builds of the CPU kernels (npu_ops/csrc) on one decoding stream of the real model,
with the bandwidth bound measured between the steps.

Build A is npu_ops/csrc at a git ref (default HEAD), build B the working tree; both are loaded into one process
and one engine, and each decode step runs on A or B in turn (ABBA order), each step followed by a read of as
many bytes as a step reads (tools/membw.py's probe). This VM's bandwidth moves by 1.5x within seconds, so only
such pairs compare: the ratio B/A is the median over pairs, the share of the bound is sum(probe seconds) /
sum(step seconds) for each build.

    PYTHONPATH=$PWD .venv/bin/python tools/ab_kernels.py [--ref HEAD] [--quant w8a8] [--int8-head] [--steps 200]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

import torch  # noqa: E402

from mindie_service import SamplingParams  # noqa: E402
from mindie_service.engine.contract import EngineRequest  # noqa: E402
from npu_ops import cpu_kernels, quant_cpu  # noqa: E402
import membw  # noqa: E402
from bench_real import kv_bytes, make_llm, shipped_gguf, weight_bytes, workload  # noqa: E402


def build(ref: str | None, out: Path, extra: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The kernels of ``ref`` (None: the working tree) compiled with the engine's flags (and ``extra``)."""
    src = out / "csrc"
    src.mkdir(parents=True)
    for path in cpu_kernels.CSRC.glob("*.[ch]"):
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text() if ref is None else subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{ref}:{rel}"], capture_output=True, text=True).stdout
        (src / path.name).write_text(text)
    so = out / "k.so"
    subprocess.run(["gcc", *cpu_kernels.FLAGS, *extra, "-o", str(so), *map(str, sorted(src.glob("*.c"))), "-lm"], check=True)
    return quant_cpu._declare(cpu_kernels._declare(_Lenient(str(so))))


class _Lenient(ctypes.CDLL):
    """A build of an older ref may lack a kernel that the declarations name (one added since): it stands in as a
    function that raises when called."""

    def __getattr__(self, name: str):  # noqa: ANN204
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("__"):
                raise

            def missing(*_: object) -> None:
                raise AttributeError(f"{name} is not in this build")
            setattr(self, name, missing)
            return missing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="HEAD")
    ap.add_argument("--quant", default=None, choices=[None, "w8a8", "w8a16"])
    ap.add_argument("--int8-head", action="store_true")
    ap.add_argument("--kv-int8", action="store_true", help="an int8 KV cache (kvCacheDtype int8)")
    ap.add_argument("--cflags", default="", help="extra compiler flags for B (macros of an experiment: -DX=4)")
    ap.add_argument("--steps", type=int, default=200, help="decode steps per build")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    libs = {"A": build(args.ref, tmp / "a"), "B": build(None, tmp / "b", tuple(args.cflags.split()))}
    current = {"lib": libs["A"]}
    cpu_kernels.load = lambda: current["lib"]  # type: ignore[assignment]  # every kernel call goes through load()
    llm = make_llm(str(shipped_gguf()), args.quant, 1, "int8" if args.int8_head else "float", decode_steps=1,
                   kv="int8" if args.kv_int8 else "auto")
    prompt = workload(llm.tokenizer, 4, 0)[0][1]
    eng = llm.engine
    eng.add_request(EngineRequest("ab", tuple(prompt), SamplingParams(max_tokens=2 * args.steps + 8, temperature=0.0,
                                                                      ignore_eos=True)))
    for _ in range(4):
        eng.step()
    nbytes = weight_bytes(llm) + kv_bytes(llm, [prompt], "int8" if args.kv_int8 else "auto")
    probe = membw.Probe(int(nbytes), torch.get_num_threads())
    step = {"A": [], "B": []}
    read = {"A": [], "B": []}
    for i in range(args.steps):
        for name in ("AB" if i % 2 == 0 else "BA"):
            current["lib"] = libs[name]
            t = time.perf_counter()
            eng.step()
            step[name].append(time.perf_counter() - t)
            read[name].append(probe.read())
    print(f"{args.quant or 'fp32'}{' + int8 head' if args.int8_head else ''}, one stream, {args.steps} steps each, "
          f"{nbytes / 1e6:.0f} MB a step, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}")
    for name in "AB":
        s, r = sum(step[name]), sum(read[name])
        print(f"  {name} ({args.ref if name == 'A' else 'working tree'}): {statistics.median(step[name]) * 1e3:.2f} ms "
              f"median step, {len(step[name]) / s:.1f} tok/s, moves {nbytes * len(step[name]) / s / 1e9:.1f} GB/s; "
              f"probe {nbytes * len(read[name]) / r / 1e9:.1f} GB/s; share of the bound {r / s:.0%}")
    ratios = [a / b for a, b in zip(step["A"], step["B"])]
    print(f"  B vs A: {statistics.median(ratios):.3f}x faster (median of {len(ratios)} pairs)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Where a GGUF serve's resident memory goes (issue 44: RSS after load <= file size + KV pool + 300 MB). Builds the
engine as the server does (an EngineConfig: weights, tokenizer, KV pool), then sends one warm-up request, and prints
RSS and USS (psutil ``memory_full_info``), the anonymous and file-backed shares (/proc/self/smaps_rollup) and glibc's
heap (``mallinfo2``: in use, free but still held) after each phase, then the owners it can name: the packed weights,
fp32 parameters and buffers (unique storages), the KV pool, the fused decoder's tables, every other live tensor, the
cached GGUF reader's mapped pages. Memory, not speed: fine on a busy machine.

    PYTHONPATH=$PWD .venv/bin/python tools/rss_breakdown.py [--gguf PATH] [--blocks 2912] [--streams 32] [--json]

``--imports`` prints instead where the RSS before any weight goes: the resident bytes each top-level package's own
module bodies added (its imports of other packages counted to those), over ``import torch``, then what ``serve`` and
the offline ``LLM`` import (a module imported while a load runs is not counted here: the phases show it).

``--streams N`` then runs N requests at once, three times, and marks the RSS after the first run, after the third (a
growth that does not stop there is unbounded) and after ``malloc_trim(0)`` (what glibc held but was free).

``--after-run`` then runs tools/bench_gguf.py's shapes (one stream after a 64-token prompt, 16 and 32 streams of
64-token prompts, a 512-token prefill; fewer tokens out) and marks the RSS once the engine is idle: the goal holds at
the end of a run too (needs ``--blocks`` for 32 x 80 tokens and ``--max-batch-size`` 32 or more).
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402  (after the path: the tool measures the interpreter before anything heavy)

MIB = 2**20
GOAL_SLACK = 300 * 10**6  # issue 44's 300 MB, decimal as tools/bench_gguf_table.py counts it (286 MiB)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap() -> tuple[int, int]:
    """glibc's (bytes in use, bytes free but held) over every arena; (0, 0) where mallinfo2 is missing."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return 0, 0
    fn.restype = _MallInfo2
    m = fn()
    return m.uordblks + m.hblkhd, m.fordblks


def smaps() -> dict[str, int]:
    """/proc/self/smaps_rollup's Rss, Anonymous and file-backed (the rest) bytes; {} off Linux."""
    out: dict[str, int] = {}
    try:
        for line in open("/proc/self/smaps_rollup", encoding="ascii"):
            key, _, val = line.partition(":")
            if val.strip().endswith("kB"):
                out[key] = int(val.split()[0]) * 1024
    except OSError:
        return {}
    return {"anon": out.get("Anonymous", 0), "file": out.get("Rss", 0) - out.get("Anonymous", 0)
            - out.get("Shmem", 0) if "Shmem" in out else out.get("Rss", 0) - out.get("Anonymous", 0)}


class Phases:
    """RSS / USS / smaps / heap after each named phase."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.rows: list[dict[str, Any]] = []

    def mark(self, name: str) -> None:
        full = self.proc.memory_full_info()
        used, free = heap()
        self.rows.append({"phase": name, "rss": full.rss, "uss": full.uss, **smaps(), "heap_used": used,
                          "heap_free": free})

    def wrap(self, module: Any, attr: str, name: str) -> None:
        """``module.attr`` replaced by a wrapper that marks ``name`` once it returns."""
        fn: Callable[..., Any] = getattr(module, attr)

        def marked(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            self.mark(name)
            return out

        setattr(module, attr, marked)


def storages(tensors: Any) -> int:
    """Bytes of the unique storages under ``tensors`` (a tensor viewed twice counts once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None or t.device.type != "cpu" or t.is_meta:
            continue
        s = t.untyped_storage()
        seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
    return sum(seen.values())


def owners(engine: Any, gguf: Path) -> dict[str, int]:
    """The bytes each owner holds (tensors by unique storage; an owner named before another takes a shared one)."""
    import torch
    from mindie_service.models import gguf_packed
    from mindie_service.models.gguf_reader import read_gguf
    model, runner = engine.model, engine.runner
    named = {
        "packed GGUF weights": [w.data for w in gguf_packed.packed_weights(model)],
        "fp32 parameters": list(model.parameters()),
        "buffers": list(model.buffers()),
        "other packed linears": [getattr(m, "packed", None) for m in model.modules()
                                 if isinstance(getattr(m, "packed", None), torch.Tensor)],
        "rope tables": [getattr(model, "rope_cos", None), getattr(model, "rope_sin", None)],
        "KV pool": [runner.kv_pool],
        "fused decoder": [v for v in vars(runner.fused).values() if isinstance(v, torch.Tensor)]
        if runner.fused is not None else [],
    }
    out: dict[str, int] = {}
    taken: set[int] = set()
    for name, ts in named.items():
        ts = [t for t in ts if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in taken]
        out[name] = storages(ts)
        taken.update(t.untyped_storage().data_ptr() for t in ts)
    gc.collect()
    with warnings.catch_warnings():  # isinstance on every object wakes torch's deprecated lazy attributes
        warnings.simplefilter("ignore")
        rest = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    out["other live tensors"] = storages(t for t in rest if t.untyped_storage().data_ptr() not in taken)
    out["GGUF file mapped, resident"] = mapped_resident(read_gguf(gguf).data)
    return out


def mapped_resident(arr: Any) -> int:
    """Resident bytes of the mapping that holds the reader's array (/proc/self/smaps of that range)."""
    start = int(arr.__array_interface__["data"][0])
    total = 0
    try:
        with open("/proc/self/smaps", encoding="ascii") as f:
            inside = False
            for line in f:
                head = line.split()[0]
                if "-" in head and not head.endswith(":"):
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = lo <= start < hi
                elif inside and head == "Rss:":
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError, TypeError):
        return 0
    return total


def build(args: argparse.Namespace, phases: Phases) -> Any:
    """The engine from an EngineConfig, as the server builds one, with phases marked inside the load."""
    from mindie_service.engine.configs.engine_config import EngineConfig
    from mindie_service.engine.core import LLMEngine
    from mindie_service.engine.runner import engine_parts
    from mindie_service.models import loader
    phases.wrap(loader, "_open", "weights read (reader, config)")
    phases.wrap(loader, "_fill", "tensors copied, packed modules built")
    phases.wrap(loader, "_pack", "packed into the arena")
    phases.wrap(engine_parts, "load_tokenizer", "tokenizer")
    cfg = EngineConfig(model=str(args.gguf), dtype="float32", max_seq_len=args.max_seq_len, cache_block_size=16,
                       num_kv_blocks=args.blocks, max_batch_size=args.max_batch_size,
                       max_prefill_batch_size=min(50, args.max_batch_size),
                       max_iter_times=min(512, args.max_seq_len))
    engine = LLMEngine(cfg)
    phases.mark("engine + KV pool")
    return engine


def warm_up(engine: Any) -> None:
    from mindie_service.engine.contract import EngineRequest
    from mindie_service.sampling_params import SamplingParams
    ids = tuple(engine.tokenizer("Hello, who are you?").input_ids)
    engine.add_request(EngineRequest("warmup", ids, SamplingParams(max_tokens=4, temperature=0.0)))
    while engine.has_work():
        engine.step()
    engine.runner.idle()  # as the serve's engine thread does when it runs out of work


def streams(engine: Any, n: int, tokens: int) -> None:
    """``n`` requests of distinct prompts, ``tokens`` each, submitted at once (the bench's many-stream shape)."""
    from mindie_service.engine.contract import EngineRequest
    from mindie_service.sampling_params import SamplingParams
    words = "the quick brown fox jumps over a lazy dog while seven hungry cats watch from the old garden wall".split()
    for i in range(n):
        text = " ".join(words[(i + j) % len(words)] for j in range(48)) + f" {i}"
        ids = tuple(engine.tokenizer(text).input_ids)
        engine.add_request(EngineRequest(f"s{i}", ids, SamplingParams(max_tokens=tokens, temperature=0.0,
                                                                     ignore_eos=True)))
    while engine.has_work():
        engine.step()
    engine.runner.idle()


def bench_run(engine: Any) -> None:
    """tools/bench_gguf.py's run shapes, 8 tokens out (what a run leaves depends on its step shapes, not its length),
    each run ending idle as ``LLM.generate`` does."""
    from mindie_service.engine.contract import EngineRequest
    from mindie_service.sampling_params import SamplingParams
    for n, prompt, out in ((1, 64, 8), (16, 64, 8), (32, 64, 8), (1, 512, 1)):
        for i in range(n):
            ids = tuple(1000 + 7 * i + k for k in range(prompt))
            engine.add_request(EngineRequest(f"b{n}-{i}", ids, SamplingParams(max_tokens=out, temperature=0.0,
                                                                             ignore_eos=True)))
        while engine.has_work():
            engine.step()
        engine.runner.idle()


class ImportMeter(importlib.abc.MetaPathFinder):
    """On sys.meta_path: each module's body run between two /proc/self/statm reads; what its own imports added is
    taken off its share, and the rest counted to its top-level package."""

    def __init__(self) -> None:
        self.own: Counter[str] = Counter()
        self._stack: list[int] = []
        self._busy = False

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        finally:
            self._busy = False
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return None
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            self._stack.append(0)
            before = _statm_rss()
            try:
                run(module)
            finally:
                grew, inner = _statm_rss() - before, self._stack.pop()
                self.own[name.partition(".")[0]] += grew - inner
                if self._stack:
                    self._stack[-1] += grew
        try:
            spec.loader.exec_module = exec_module
        except (AttributeError, TypeError):  # a loader that refuses the attribute: counted to its importer
            return None
        return spec


def _statm_rss() -> int:
    with open("/proc/self/statm", "rb") as f:  # bytes: a text codec's lookup would import inside the meter
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def imports_report() -> None:
    """The floor before any weight: interpreter, torch, then serve's and LLM's imports, by top-level package."""
    meter = ImportMeter()
    sys.meta_path.insert(0, meter)
    steps = [("import torch", "torch"), ("serve's imports", "mindie_service.server.main"),
             ("the offline LLM's", "mindie_service.llm")]
    print(f"interpreter: RSS {_statm_rss() / MIB:.0f} MiB")
    for title, module in steps:
        meter.own.clear()
        before = _statm_rss()
        importlib.import_module(module)
        print(f"{title}: +{(_statm_rss() - before) / MIB:.1f} MiB (RSS {_statm_rss() / MIB:.0f})")
        for pkg, n in meter.own.most_common(12):
            if n >= MIB // 4:
                print(f"  {pkg:28} {n / MIB:6.1f}")


def report(phases: Phases, own: dict[str, int], file_bytes: int, kv: int, as_json: bool) -> None:
    goal = file_bytes + kv + GOAL_SLACK
    if as_json:
        print(json.dumps({"phases": phases.rows, "owners": own, "file": file_bytes, "kv": kv, "goal": goal}))
        return
    print(f"{'phase':40} {'RSS':>7} {'USS':>7} {'anon':>7} {'file':>7} {'heap':>7} {'free':>7}  (MiB)")
    for r in phases.rows:
        print(f"{r['phase']:40} " + " ".join(f"{r.get(k, 0) / MIB:7.0f}"
                                             for k in ("rss", "uss", "anon", "file", "heap_used", "heap_free")))
    print("\nowners after the warm-up (MiB):")
    for k, v in own.items():
        print(f"  {k:32} {v / MIB:8.1f}")
    last = phases.rows[-1]["rss"]
    print(f"\nfile {file_bytes / MIB:.0f} MiB + KV pool {kv / MIB:.0f} MiB + 300 MB ({GOAL_SLACK / MIB:.0f} MiB) = goal "
          f"{goal / MIB:.0f} MiB; "
          f"RSS {last / MIB:.0f} MiB ({(last - goal) / MIB:+.0f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default=None, help="default: the packaged SmolLM2-135M-Instruct Q4_1 .gguf")
    ap.add_argument("--blocks", type=int, default=2912, help="KV blocks of 16 (2912: the shipped config's 2 GiB)")
    ap.add_argument("--max-seq-len", type=int, default=2048)
    ap.add_argument("--max-batch-size", type=int, default=200)
    ap.add_argument("--streams", type=int, default=0, help="then this many requests at once (the growth a run adds, once idle)")
    ap.add_argument("--stream-tokens", type=int, default=64, help="tokens each of --streams generates")
    ap.add_argument("--after-run", action="store_true", help="then tools/bench_gguf.py's run shapes, and the RSS once idle")
    ap.add_argument("--json", action="store_true", help="one JSON line instead of the table")
    ap.add_argument("--imports", action="store_true", help="only the RSS the imports add, by top-level package")
    args = ap.parse_args()
    if args.imports:
        imports_report()
        return
    phases = Phases()
    phases.mark("interpreter")
    t = time.perf_counter()
    import mindie_service.server.main  # noqa: F401  (what `serve` imports before it loads a model)
    from mindie_service.models.packaged_models import packaged_file
    phases.mark("imports")
    args.gguf = Path(args.gguf or packaged_file("SmolLM2-135M-Instruct"))
    engine = build(args, phases)
    warm_up(engine)
    phases.mark("one warm-up request")
    if args.streams:
        streams(engine, args.streams, args.stream_tokens)
        phases.mark(f"{args.streams} streams x {args.stream_tokens} tokens")
        for _ in range(2):
            streams(engine, args.streams, args.stream_tokens)
        phases.mark("the same twice more")
        from npu_ops.memory import trim_heap
        trim_heap()
        phases.mark("then malloc_trim(0)")
    if args.after_run:
        bench_run(engine)
        phases.mark("after the bench's run shapes (idle)")
    own = owners(engine, args.gguf)
    report(phases, own, args.gguf.stat().st_size, engine.runner.kv_pool_bytes, args.json)
    print(f"({time.perf_counter() - t:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()

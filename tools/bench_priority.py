#!/usr/bin/env python3
"""Request priority under load (issue 47): the time to first token of high-priority short requests on an idle
server, then under a saturating low-priority load (--streams streams of long prompts, each sending requests back
to back), and their ratio (target: loaded p50 within 1.3x of idle p50).

The probes go one after another (a probe's TTFT is never its sibling's queueing), each with the dialect's most
urgent priority, after a random pause of up to ``--gap-ms`` (so they do not arrive in step with the engine's steps);
the load runs at its least urgent. ``--baseline`` also measures probes at the default priority, alternating with the
urgent ones under the same load: the load's 32 identical streams move in waves (all prefilling, then all decoding),
and probes measured one set after the other would compare phases of the load, not priorities. Each set of probes
has prompts of its own (a prompt seen before would find its blocks in the prefix cache). Priority fields per route
(params.priority's table): ``/v1/completions`` vLLM's ``priority`` (lower first), ``/infer`` MindIE's
``parameters.priority`` (1 first).

Against a running server:   tools/bench_priority.py --url http://127.0.0.1:1025
Against one it starts:      tools/bench_priority.py --model models/small   (plain HTTP, the shipped
                            conf/config.json's ScheduleConfig; --kv-blocks bounds the KV pool)
Smoke run:                  tools/bench_priority.py --model models/tiny --streams 4 --probes 3 --prompt-words 40

``--phases`` (with --model) runs the server at DEBUG and reads its per-sequence phase lines (serving.streams.
phase_line): the median ms from the call's start to each phase for the urgent probes, idle and loaded, and the
client's TTFT beside the server's (their difference: the HTTP request's read before the call starts, and the
first frame's write and delivery). A breakdown, not a figure: DEBUG logging costs a little.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))

from bench_serve import prompts, start_server  # noqa: E402
from tests.server_utils import free_port, stop_process  # noqa: E402

URGENT = {"openai": -10, "infer": 1}  # each route's most urgent priority
LOW = {"openai": 10, "infer": 5}  # and its least urgent (MindIE's 5 is also its default)


def _body(route: str, model: str, prompt: str, max_new: int, priority: int | None) -> tuple[str, dict]:
    if route == "openai":
        body: dict = {"model": model, "prompt": prompt, "max_tokens": max_new, "stream": True, "ignore_eos": True}
        if priority is not None:
            body["priority"] = priority
        return "/v1/completions", body
    params: dict = {"max_new_tokens": max_new}
    if priority is not None:
        params["priority"] = priority
    return "/infer", {"inputs": prompt, "stream": True, "parameters": params}


async def _ttft(session: aiohttp.ClientSession, url: str, route: str, model: str, prompt: str, max_new: int,
                priority: int | None) -> float:
    """Seconds to the first data frame of a streamed request (read to its end)."""
    path, body = _body(route, model, prompt, max_new, priority)
    t0 = time.perf_counter()
    first = None
    async with session.post(url + path, json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{path}: HTTP {resp.status}: {(await resp.text())[:300]}")
        async for raw in resp.content:
            if first is None and raw.strip().startswith(b"data:"):
                first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError(f"{path}: no frame")
    return first


async def _probes(session: aiohttp.ClientSession, args: argparse.Namespace, url: str, model: str,
                  priorities: list[int | None], seed: int) -> list[list[float]]:
    """TTFTs of ``args.probes`` probes at each of ``priorities`` (alternating), one probe at a time."""
    rng = random.Random(seed)
    sets = [prompts(args.probes, args.probe_words, seed=seed + k) for k in range(len(priorities))]
    out: list[list[float]] = [[] for _ in priorities]
    for i in range(args.probes):
        for k, priority in enumerate(priorities):
            await asyncio.sleep(rng.uniform(0, args.gap_ms / 1e3))
            out[k].append(await _ttft(session, url, args.route, model, sets[k][i], args.probe_tokens, priority))
    return out


async def _load(session: aiohttp.ClientSession, args: argparse.Namespace, url: str, model: str, stop: asyncio.Event,
                started: list[int]) -> None:
    """One low-priority stream: long prompts back to back until ``stop``."""
    k = 0
    while not stop.is_set():
        p = prompts(1, args.prompt_words, seed=1000 + len(started) * 100 + k)[0]
        k += 1
        await _ttft(session, url, args.route, model, p, args.load_tokens, LOW[args.route])
        started.append(1)


async def _measure(args: argparse.Namespace, url: str) -> dict:
    timeout = aiohttp.ClientTimeout(total=None, sock_read=args.timeout)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        async with session.get(url + "/v1/models") as r:
            model = (await r.json())["data"][0]["id"]
        await _probes(session, args, url, model, [URGENT[args.route]], seed=7)  # warm-up (kernels, caches)
        idle = (await _probes(session, args, url, model, [URGENT[args.route]], seed=17))[0]
        stop, done = asyncio.Event(), []
        loads = [asyncio.ensure_future(_load(session, args, url, model, stop, done)) for _ in range(args.streams)]
        await asyncio.sleep(args.warmup_s)  # the load's prefills under way and the batch full
        loaded, *rest = await _probes(session, args, url, model,
                                      [URGENT[args.route]] + ([None] if args.baseline else []), seed=27)
        base = rest[0] if rest else []
        stop.set()
        for t in loads:
            t.cancel()
        await asyncio.gather(*loads, return_exceptions=True)
    out = {"route": args.route, "streams": args.streams, "prompt_words": args.prompt_words,
           "idle_p50_s": statistics.median(idle), "loaded_p50_s": statistics.median(loaded),
           "load_requests_done": len(done)}
    out["ratio"] = out["loaded_p50_s"] / out["idle_p50_s"]
    if base:
        out["default_priority_p50_s"] = statistics.median(base)
    return out


def _config(args: argparse.Namespace, out: Path) -> Path:
    sched = json.loads((ROOT / "conf" / "config.json").read_text())["BackendConfig"]["ScheduleConfig"]
    sched = {**sched, "numKvBlocks": args.kv_blocks}
    cfg = {"ServerConfig": {"ipAddress": "127.0.0.1", "managementIpAddress": "127.0.0.1", "port": free_port(),
                            "managementPort": free_port(), "metricsPort": free_port(), "httpsEnabled": False,
                            "maxLinkNum": 1000},
           "BackendConfig": {"tokenizerProcessNumber": 2, "ModelDeployConfig": {
               "maxSeqLen": args.max_seq_len, "maxInputTokenLen": args.max_seq_len - 1,
               "ModelConfig": [{"modelName": Path(args.model).name,
                                "modelWeightPath": str(Path(args.model).absolute())}]},
               "ScheduleConfig": sched}}
    if args.phases:
        cfg["LogConfig"] = {"logLevel": "Debug"}
    out.write_text(json.dumps(cfg))
    return out


_PHASE = re.compile(r"phases (\S+) rank=(-?\d+) (.*)$")


def phases(log: Path, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Median ms from the call's start to each phase, for the idle and the loaded urgent probes (the server log's
    phase lines in order: warm-up, idle, then the loaded ones; probes run one at a time)."""
    rank = {"openai": -10, "infer": -4}[args.route]  # URGENT as the engine ranks it (params.priority)
    rows = []
    for line in log.read_text(errors="replace").splitlines():
        m = _PHASE.search(line)
        if m and int(m.group(2)) == rank:
            rows.append({k: float(v) for k, v in (kv.split("=") for kv in m.group(3).split()) if v != "-"})
    sets = {"idle": rows[args.probes:2 * args.probes], "loaded": rows[2 * args.probes:]}
    return {name: {k: round(statistics.median(r[k] for r in rs if k in r), 2) for k in rs[0]}
            for name, rs in sets.items() if rs}


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", help="base URL of a running plain-HTTP server (business port)")
    src.add_argument("--model", help="checkpoint folder: start a plain-HTTP server for it")
    ap.add_argument("--route", default="openai", choices=["openai", "infer"])
    ap.add_argument("--streams", type=int, default=32, help="low-priority load streams")
    ap.add_argument("--prompt-words", type=int, default=600, help="words per long (load) prompt")
    ap.add_argument("--load-tokens", type=int, default=128, help="tokens each load request generates")
    ap.add_argument("--probes", type=int, default=20, help="high-priority requests per measurement")
    ap.add_argument("--probe-words", type=int, default=12)
    ap.add_argument("--probe-tokens", type=int, default=8)
    ap.add_argument("--gap-ms", type=float, default=50.0, help="a random pause of up to this before each probe")
    ap.add_argument("--warmup-s", type=float, default=10.0, help="load time before the loaded probes")
    ap.add_argument("--baseline", action="store_true", help="also probe under load at the default priority")
    ap.add_argument("--kv-blocks", type=int, default=None, help="--model: numKvBlocks (default: sized by the engine)")
    ap.add_argument("--max-seq-len", type=int, default=4096, help="--model: maxSeqLen")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a read may wait")
    ap.add_argument("--phases", action="store_true", help="--model: where the urgent probes' TTFT goes (server log)")
    return ap.parse_args()


def main() -> int:
    args = _args()
    proc = None
    with tempfile.TemporaryDirectory(prefix="bench_priority_") as tmp:
        url = args.url
        if url is None:
            proc, url = start_server(_config(args, Path(tmp) / "config.json"), Path(tmp) / "server.log")
        try:
            res = asyncio.run(_measure(args, url))
        finally:
            if proc is not None:
                stop_process(proc)
        if args.phases and proc is not None:
            res["phases_ms"] = phases(Path(tmp) / "server.log", args)
    print(json.dumps(res))
    base = (f"; default priority under the same load {res['default_priority_p50_s'] * 1e3:.1f} ms"
            if "default_priority_p50_s" in res else "")
    print(f"# high-priority TTFT p50: idle {res['idle_p50_s'] * 1e3:.1f} ms, under {args.streams} low-priority "
          f"streams {res['loaded_p50_s'] * 1e3:.1f} ms: {res['ratio']:.2f}x (target <= 1.3x){base}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Online latency beside a batch job: does batch work stay below online traffic? (issue #27)

Starts the server with the shipped config's ScheduleConfig (conf/config.json: maxBatchSize 64, so
batchMaxRunning is 16 lines) on the small demo model, measures the time to first token of ``--online``
sequential short streaming requests on `POST /` with no job (before and after it: the idle p50 is the
median of both rounds), then while a ``--lines``-line job of 40-100-word conversations at
``--max-tokens`` tokens runs, and prints the idle p50, the busy p50, their ratio against the goal (1.3)
and whether the job then finishes with every line. ``--schedule KEY=VALUE`` (repeatable; JSON values)
and ``--server KEY=VALUE`` override keys of the shipped ScheduleConfig / the ServerConfig.

    .venv/bin/python tools/bench_jobs.py --lines 600 --online 40
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mindie_service.devkit.presets import build_demo_model  # noqa: E402
from tests.prompts import WORDS, word_prompts  # noqa: E402
from tests.server_utils import ServerProcess, write_config  # noqa: E402

GOAL = 1.3


def ttft(srv: ServerProcess, prompt: str) -> float:
    body = {"inputs": prompt, "stream": True, "parameters": {"max_new_tokens": 16}}
    t0 = time.perf_counter()
    with requests.post(srv.url() + "/", json=body, stream=True, timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data:"):
                return time.perf_counter() - t0
    raise RuntimeError("no token")


def online_round(srv: ServerProcess, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    out = []
    for p in word_prompts(n, 8, 40, seed=seed):
        out.append(ttft(srv, p))
        time.sleep(rng.uniform(0.02, 0.12))  # arrivals fall anywhere in the batch's steps
    return out


def conversations(n: int, seed: int) -> list[list[dict[str, str]]]:
    """``n`` three-message conversations (user, assistant, user) of 40-100 words in all."""
    rng = random.Random(seed)
    convs = []
    for _ in range(n):
        total = rng.randint(40, 100)
        a = rng.randint(10, total - 20)
        b = rng.randint(5, total - a - 10)
        sizes = (a, b, total - a - b)
        texts = [" ".join(rng.choice(WORDS) for _ in range(k)).capitalize() for k in sizes]
        convs.append([{"role": r, "text": t} for r, t in zip(("user", "assistant", "user"), texts)])
    return convs


def overrides(pairs: list[str]) -> dict[str, object]:
    return {k: json.loads(v) for k, v in (p.split("=", 1) for p in pairs)}


def job_status(srv: ServerProcess, job: str) -> dict:
    return srv.get(f"/batch_inference/job_status?job_id={job}").json()


def run(args: argparse.Namespace, tmp: Path) -> None:
    schedule = json.loads((ROOT / "conf" / "config.json").read_text())["BackendConfig"]["ScheduleConfig"]
    schedule.update(overrides(args.schedule))
    server = {"batchJobsDir": str(tmp / "jobs"), "maxLinkNum": 64, **overrides(args.server)}
    cfg = write_config(tmp / "config.json", Path(args.model), model_name="small", server=server,
                       deploy={"maxSeqLen": 1024, "maxInputTokenLen": 512}, schedule=schedule)
    srv = ServerProcess(cfg, tmp / "server.log").start().wait_ready(300)
    try:
        online_round(srv, 5, seed=99)  # warm-up
        before = online_round(srv, args.online, seed=1)
        lines = "\n".join(json.dumps(c) for c in conversations(args.lines, seed=2))
        body = {"model": "small", "options": {"max_tokens": args.max_tokens, "temperature": 0},
                "prompt_file_path": {"type": "raw_bytes", "value": base64.b64encode(lines.encode()).decode()}}
        job = srv.post("/batch_inference/submit_job", body).json()["job_id"]
        time.sleep(2.0)  # let the job fill its share of the batch
        t_job = time.monotonic()
        busy = online_round(srv, args.online, seed=1)
        written = job_status(srv, job)["metadata"]["generations_written"]
        while job_status(srv, job)["status"] in ("validating", "running"):
            time.sleep(1.0)
        st = job_status(srv, job)
        after = online_round(srv, args.online, seed=1)
    finally:
        srv.stop()
    idle = statistics.median(before + after)
    ratio = statistics.median(busy) / idle
    print(f"schedule overrides {overrides(args.schedule)} server overrides {overrides(args.server)}; "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"online TTFT p50 idle {idle * 1e3:.1f} ms (before {statistics.median(before) * 1e3:.1f}, after "
          f"{statistics.median(after) * 1e3:.1f}), beside a {args.lines}-line job {statistics.median(busy) * 1e3:.1f} ms "
          f"(p90 {statistics.quantiles(busy, n=10)[-1] * 1e3:.1f}): ratio {ratio:.2f}, goal <= {GOAL} "
          f"{'met' if ratio <= GOAL else 'NOT met'}")
    done = st["status"] == "completed" and st["metadata"]["generations_written"] == args.lines
    print(f"job {st['status']}: {st['metadata']['generations_written']}/{args.lines} lines written "
          f"({written} during the online round), {st['metadata']['tokens']} tokens, "
          f"{time.monotonic() - t_job + 2:.0f} s; every line finished: {done}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models" / "small"))
    ap.add_argument("--lines", type=int, default=600)
    ap.add_argument("--online", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=128, help="output tokens of each job line")
    ap.add_argument("--schedule", action="append", default=[], metavar="KEY=JSON")
    ap.add_argument("--server", action="append", default=[], metavar="KEY=JSON")
    args = ap.parse_args()
    build_demo_model("small", args.model, if_missing=True)
    with tempfile.TemporaryDirectory() as tmp_s:
        run(args, Path(tmp_s))


if __name__ == "__main__":
    main()

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
import functools
import json
import os
import sys
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.server_utils import ServerProcess  # noqa: E402
from tools.bench_online import (compare, conversations, main as bench_main, online_round, overrides,  # noqa: E402
                                start_server)


def ttft(srv: ServerProcess, prompt: str) -> float:
    body = {"inputs": prompt, "stream": True, "parameters": {"max_new_tokens": 16}}
    t0 = time.perf_counter()
    with requests.post(srv.url() + "/", json=body, stream=True, timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data:"):
                return time.perf_counter() - t0
    raise RuntimeError("no token")


def job_status(srv: ServerProcess, job: str) -> dict:
    return srv.get(f"/batch_inference/job_status?job_id={job}").json()


def run(args: argparse.Namespace, tmp: Path) -> None:
    srv = start_server(args, tmp, {"batchJobsDir": str(tmp / "jobs")}, "server.log")
    probe = functools.partial(ttft, srv)
    try:
        online_round(probe, 5, seed=99)  # warm-up
        before = online_round(probe, args.online, seed=1)
        lines = "\n".join(json.dumps(c) for c in conversations(args.lines, seed=2))
        body = {"model": "small", "options": {"max_tokens": args.max_tokens, "temperature": 0},
                "prompt_file_path": {"type": "raw_bytes", "value": base64.b64encode(lines.encode()).decode()}}
        job = srv.post("/batch_inference/submit_job", body).json()["job_id"]
        time.sleep(2.0)  # let the job fill its share of the batch
        t_job = time.monotonic()
        busy = online_round(probe, args.online, seed=1)
        written = job_status(srv, job)["metadata"]["generations_written"]
        while job_status(srv, job)["status"] in ("validating", "running"):
            time.sleep(1.0)
        st = job_status(srv, job)
        after = online_round(probe, args.online, seed=1)
    finally:
        srv.stop()
    print(f"schedule overrides {overrides(args.schedule)} server overrides {overrides(args.server)}; "
          f"load {os.getloadavg()[0]:.2f}")
    print(compare(before, busy, after, f"a {args.lines}-line job"))
    done = st["status"] == "completed" and st["metadata"]["generations_written"] == args.lines
    print(f"job {st['status']}: {st['metadata']['generations_written']}/{args.lines} lines written "
          f"({written} during the online round), {st['metadata']['tokens']} tokens, "
          f"{time.monotonic() - t_job + 2:.0f} s; every line finished: {done}", flush=True)


if __name__ == "__main__":
    bench_main(__doc__, lines=600, max_tokens=128, run=run)

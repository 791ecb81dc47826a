#!/usr/bin/env python3
"""Online latency beside a batch job: does batch work stay below online traffic?

Starts the server on the small demo model (default maxBatchSize, so batchMaxRunning is a quarter of
it), measures the time to first token of ``--online`` sequential streaming requests on `POST /` with
no job, then again while a ``--lines``-line job runs, and prints both p50s, their ratio (goal <= 1.5)
and whether the job then finishes.

    .venv/bin/python tools/bench_jobs.py --lines 600 --online 30
"""
from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mindie_service.devkit.presets import build_demo_model  # noqa: E402
from tests.prompts import word_prompts  # noqa: E402
from tests.server_utils import ServerProcess, write_config  # noqa: E402


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
    return [ttft(srv, p) for p in word_prompts(n, 16, 120, seed=seed)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models" / "small"))
    ap.add_argument("--lines", type=int, default=600)
    ap.add_argument("--online", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=64, help="output tokens of each job line")
    args = ap.parse_args()
    build_demo_model("small", args.model, if_missing=True)
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        cfg = write_config(tmp / "config.json", Path(args.model), model_name="small",
                           server={"batchJobsDir": str(tmp / "jobs"), "maxLinkNum": 64},
                           deploy={"maxSeqLen": 1024, "maxInputTokenLen": 512},
                           schedule={"maxBatchSize": 200, "maxPrefillBatchSize": 50, "maxPrefillTokens": 8192,
                                     "maxIterTimes": 512})
        srv = ServerProcess(cfg, tmp / "server.log").start().wait_ready(300)
        try:
            online_round(srv, 3, seed=99)  # warm-up
            alone = online_round(srv, args.online, seed=1)
            lines = "\n".join(json.dumps([{"role": "user", "text": p}]) for p in word_prompts(args.lines, 8, 200, seed=2))
            body = {"model": "small", "options": {"max_tokens": args.max_tokens, "temperature": 0},
                    "prompt_file_path": {"type": "raw_bytes", "value": base64.b64encode(lines.encode()).decode()}}
            job = srv.post("/batch_inference/submit_job", body).json()["job_id"]
            time.sleep(2.0)  # let the job fill its share of the batch
            beside = online_round(srv, args.online, seed=1)
            st = srv.get(f"/batch_inference/job_status?job_id={job}").json()
            print(f"online TTFT p50 alone {statistics.median(alone) * 1e3:.1f} ms, beside a {args.lines}-line job "
                  f"{statistics.median(beside) * 1e3:.1f} ms, ratio {statistics.median(beside) / statistics.median(alone):.2f} "
                  f"(goal <= 1.5); job progress during the online round: "
                  f"{st['metadata']['generations_written']} lines written", flush=True)
            t0 = time.monotonic()
            while srv.get(f"/batch_inference/job_status?job_id={job}").json()["status"] == "running":
                time.sleep(2.0)
            st = srv.get(f"/batch_inference/job_status?job_id={job}").json()
            print(f"job {st['status']}: {st['metadata']['generations_written']} records, "
                  f"{st['metadata']['tokens']} tokens, {time.monotonic() - t0 + 2:.0f} s after the online round")
        finally:
            srv.stop()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""OpenAI's batch workflow against a local server, with online latency beside it (issue #48).

Starts the server with the shipped config's ScheduleConfig on the small demo model, then with the pinned
`openai` client: ``files.create`` of a ``--lines``-line JSONL of /v1/chat/completions requests (40-100-word
conversations, greedy, ``--max-tokens``), ``batches.create``, ``batches.retrieve`` polling, ``files.content``.
Meanwhile it measures the time to first token of ``--online`` sequential streaming chat requests with no batch
(before and after: the idle p50 is the median of both rounds) and while the batch runs, and prints their ratio
against the batch-jobs goal (1.3, tools/bench_jobs.py). With ``--kill`` the server is killed (SIGKILL) once a
third of the lines are answered and started again; the batch must still end with each custom_id exactly once.
``--check N`` sends N of the lines to the online route afterwards: their bodies must equal the batch's (ids and
timestamps aside).

    .venv/bin/python tools/bench_batches.py --lines 200 --online 40 --kill
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.server_utils import ServerProcess  # noqa: E402
from tools.bench_online import (compare, conversations, main as bench_main, online_round, overrides,  # noqa: E402
                                start_server)

VOLATILE = ("id", "created", "cached_tokens")


def ttft(client: openai.OpenAI, prompt: str) -> float:
    t0 = time.perf_counter()
    with client.chat.completions.create(model="small", messages=[{"role": "user", "content": prompt}],
                                        max_tokens=16, stream=True) as stream:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                return time.perf_counter() - t0
    raise RuntimeError("no token")


def bodies(n: int, max_tokens: int) -> list[dict[str, Any]]:
    return [{"model": "small", "max_tokens": max_tokens, "temperature": 0,
             "messages": [{"role": m["role"], "content": m["text"]} for m in conv]}
            for conv in conversations(n, seed=2)]


def strip(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: strip(v) for k, v in obj.items() if k not in VOLATILE}
    return [strip(v) for v in obj] if isinstance(obj, list) else obj


def start(args: argparse.Namespace, tmp: Path) -> tuple[ServerProcess, openai.OpenAI]:
    server = {"batchJobsDir": str(tmp / "jobs"), "filesStore": {"dir": str(tmp / "files")}}
    srv = start_server(args, tmp, server, f"server-{len(list(tmp.glob('server*.log')))}.log")
    return srv, openai.OpenAI(base_url=srv.url() + "/v1", api_key="none", max_retries=0, timeout=600)


def wait(client: openai.OpenAI, bid: str, until: Any) -> Any:
    while True:
        b = client.batches.retrieve(bid)
        if until(b):
            return b
        time.sleep(0.5)


def run(args: argparse.Namespace, tmp: Path) -> None:
    srv, client = start(args, tmp)
    lines = bodies(args.lines, args.max_tokens)
    try:
        online_round(functools.partial(ttft, client), 5, seed=99)  # warm-up
        before = online_round(functools.partial(ttft, client), args.online, seed=1)
        data = "".join(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
                                   "body": b}) + "\n" for i, b in enumerate(lines)).encode()
        f = client.files.create(file=("bench.jsonl", data), purpose="batch")
        t0 = time.monotonic()
        bid = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id
        time.sleep(2.0)  # let the batch fill its share of the engine
        busy = online_round(functools.partial(ttft, client), args.online, seed=1)
        if args.kill:
            wait(client, bid, lambda b: b.request_counts.completed >= args.lines // 3 or b.status == "completed")
            srv.proc.kill()
            srv.proc.wait(10)
            srv, client = start(args, tmp)
        b = wait(client, bid, lambda b: b.status in ("completed", "failed", "expired", "cancelled"))
        took = time.monotonic() - t0
        out = [json.loads(x) for x in client.files.content(b.output_file_id).text.splitlines()] \
            if b.output_file_id else []
        after = online_round(functools.partial(ttft, client), args.online, seed=1)
        same = sum(strip(r["response"]["body"]) == strip(client.chat.completions.create(
            **lines[int(r["custom_id"].split("-")[1])]).model_dump(exclude_unset=True)) for r in out[:args.check])
    finally:
        srv.stop()
    counts = Counter(r["custom_id"] for r in out)
    print(f"load {os.getloadavg()[0]:.2f}; schedule overrides {overrides(args.schedule)}")
    print(compare(before, busy, after, f"a {args.lines}-line batch"))
    print(f"batch {b.status} in {took:.0f} s{' across a kill -9' if args.kill else ''}: "
          f"{b.request_counts.completed}/{args.lines} answered, {len(counts)} custom_ids, "
          f"{sum(c > 1 for c in counts.values())} written twice; {same}/{min(args.check, len(out))} bodies equal "
          "the online route's", flush=True)


def _flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--check", type=int, default=20, help="lines compared with the online route afterwards")
    ap.add_argument("--kill", action="store_true", help="kill -9 the server a third of the way and restart it")


if __name__ == "__main__":
    bench_main(__doc__, lines=200, max_tokens=64, run=run, more=_flags)

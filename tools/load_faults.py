#!/usr/bin/env python3
"""Streaming load with clients that vanish, then a leak check (issue #15, "load and fault figures").

N streaming requests (`POST /` and `POST /generate_stream` in turn) from C concurrent clients on
keep-alive connections; a share of them (default a third) disconnect at a random moment: a quarter
of those before the first token, the rest after a random number of frames. Seeded: the same
arguments give the same prompts, lengths and disconnect points. Afterwards it checks, and prints:

- the engine went idle: zero running, waiting and in-flight requests (`/v1/status`)
- zero KV blocks in use (blocks kept by the prefix cache with no reference count as free)
- server RSS within --rss-tolerance (default 5%) of where it stood after a warm-up round
- the greedy output of a fixed probe set is the same before and after
- no ERROR, CRITICAL or traceback in the server log (disconnects are INFO lines)
- every request that did not disconnect finished with 200 and a final frame

Exit code 0 when every check passes. Figures: requests/s held, TTFT and end-to-end p50/p99.

Against a server it starts:  tools/load_faults.py --model models/tiny [--requests 1000 --clients 64]
Against a running one:       tools/load_faults.py --url http://127.0.0.1:1025 --management-url URL
                             [--pid PID --log server.log]   (RSS and log checks need them)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.prompts import WORDS  # noqa: E402
from tests.server_utils import free_port, percentile, stop_process  # noqa: E402

PROBES = ["The lantern by the harbor window", "River mountain city garden", "Quiet market morning in winter",
          "A pilot over the ocean castle"]
# Lines the log may hold at WARNING or above without counting as a problem: access lines of refused
# requests are judged by the client figures instead.
_BAD_LOG = re.compile(r" (ERROR|CRITICAL) |Traceback \(most recent call last\)")


@dataclass
class Outcome:
    route: str
    disconnect_at: int | None  # frames read before going away; 0 = before the first token; None = stays
    status: int | None = None
    frames: int = 0
    finished: bool = False
    error: str = ""
    ttft: float | None = None
    e2e: float | None = None


@dataclass
class Plan:
    prompt: str
    max_new: int
    route: str
    disconnect_at: int | None
    delay_s: float = 0.0  # for disconnect_at == 0: how long after sending the client gives up


def make_plans(n: int, share: float, max_new: int, seed: int) -> list[Plan]:
    rng = random.Random(seed)
    plans = []
    for i in range(n):
        words = rng.randint(4, 64)
        new = rng.randint(4, max_new)
        at: int | None = None
        delay = 0.0
        if rng.random() < share:
            at = 0 if rng.random() < 0.25 else rng.randint(1, new)
            delay = rng.uniform(0.0, 0.05)
        prompt = " ".join(rng.choice(WORDS) for _ in range(words)).capitalize()
        plans.append(Plan(prompt, new, "/" if i % 2 == 0 else "/generate_stream", at, delay))
    return plans


async def stream_one(session: aiohttp.ClientSession, url: str, plan: Plan) -> Outcome:
    out = Outcome(plan.route, plan.disconnect_at)
    body: dict[str, Any] = {"inputs": plan.prompt, "parameters": {"max_new_tokens": plan.max_new}}
    if plan.route == "/":
        body["stream"] = True
    t0 = time.perf_counter()

    async def run() -> None:
        async with session.post(url + plan.route, json=body) as resp:
            out.status = resp.status
            if resp.status != 200:
                out.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                frame = json.loads(line[5:])
                if "error" in frame:
                    out.error = f"error frame: {frame}"
                    return
                if out.ttft is None:
                    out.ttft = time.perf_counter() - t0
                out.frames += 1
                if frame.get("generated_text") is not None:
                    out.finished = True
                    out.e2e = time.perf_counter() - t0
                if plan.disconnect_at is not None and out.frames >= plan.disconnect_at:
                    resp.close()  # drop the connection mid-stream
                    return

    try:
        if plan.disconnect_at == 0:
            try:  # gone before the first token: the task is cancelled, aiohttp closes the connection
                await asyncio.wait_for(run(), plan.delay_s)
            except asyncio.TimeoutError:
                pass
        else:
            await run()
    except aiohttp.ClientError as e:
        out.error = f"{type(e).__name__}: {e}"
    return out


async def run_load(url: str, plans: list[Plan], clients: int) -> tuple[list[Outcome], float]:
    queue: asyncio.Queue[Plan] = asyncio.Queue()
    for p in plans:
        queue.put_nowait(p)
    outcomes: list[Outcome] = []
    conn = aiohttp.TCPConnector(limit=clients, force_close=False)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as session:
        async def client() -> None:
            while not queue.empty():
                outcomes.append(await stream_one(session, url, queue.get_nowait()))

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return outcomes, time.perf_counter() - t0


# -- the server's side ---------------------------------------------------------------------------------
def get_json(url: str) -> Any:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def post_json(url: str, body: Any) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def probe(url: str) -> list[str]:
    texts = []
    for p in PROBES:
        status, body = post_json(url + "/", {"inputs": p, "parameters": {"max_new_tokens": 24}})
        texts.append(body[0]["generated_text"] if status == 200 else f"HTTP {status}: {body}")
    return texts


def wait_idle(mgmt: str, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        st = get_json(mgmt + "/v1/status")
        r = st["requests"]
        if r["running"] == 0 and r["waiting"] == 0 and r["in_flight"] == 0 and st["blocks"]["used"] == 0:
            return st
        if time.monotonic() > deadline:
            return st
        time.sleep(0.2)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def log_lines(log: Path, offset: int) -> tuple[list[str], int]:
    """The log's ERROR/CRITICAL/traceback lines since ``offset``, and how many disconnects it noted."""
    text = log.read_text(errors="replace")[offset:]
    return [line for line in text.splitlines() if _BAD_LOG.search(line)], text.count("client disconnected")


def start_server(model: Path, clients: int, workdir: Path) -> tuple[subprocess.Popen, str, str, Path]:
    from mindie_service.devkit.presets import PRESETS, build_demo_model

    if not (model / "config.json").is_file() and model.name in PRESETS:
        build_demo_model(model.name, str(model), if_missing=True)
    port, mport = free_port(), free_port()
    cfg = {"ServerConfig": {"ipAddress": "127.0.0.1", "managementIpAddress": "127.0.0.1", "port": port,
                            "managementPort": mport, "metricsPort": mport, "httpsEnabled": False,
                            "maxLinkNum": clients + 8},
           "BackendConfig": {"tokenizerProcessNumber": 2, "ModelDeployConfig": {
               "maxSeqLen": 1024, "maxInputTokenLen": 512,
               "ModelConfig": [{"modelName": model.name, "modelWeightPath": str(model.absolute())}]},
               "ScheduleConfig": {"cacheBlockSize": 16, "maxBatchSize": min(64, clients),
                                  "maxPrefillBatchSize": min(16, clients), "maxPrefillTokens": 2048,
                                  "maxIterTimes": 512, "numKvBlocks": 2048}}}
    config, log = workdir / "config.json", workdir / "server.log"
    config.write_text(json.dumps(cfg))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env.pop("MINDIE_SERVICE_FAULTS", None)  # this run measures a healthy server
    proc = subprocess.Popen([sys.executable, "-m", "mindie_service", "serve", "--config", str(config)], cwd=ROOT,
                            env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    url, mgmt = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{mport}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited ({proc.returncode}):\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if get_json(mgmt + "/v1/status").get("status") == "ready":
                return proc, url, mgmt, log
        except OSError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit(f"server not ready; see {log}")


def measure(args: argparse.Namespace, url: str, mgmt: str, pid: int | None, log: Path | None) -> dict[str, Any]:
    before = probe(url)
    warm = make_plans(args.warmup, args.disconnect_share, args.max_new_tokens, seed=args.seed + 1)
    asyncio.run(run_load(url, warm, args.clients))
    wait_idle(mgmt)
    rss0 = rss_bytes(pid) if pid else None
    log_offset = len(log.read_text(errors="replace")) if log else 0

    plans = make_plans(args.requests, args.disconnect_share, args.max_new_tokens, seed=args.seed)
    outcomes, wall = asyncio.run(run_load(url, plans, args.clients))
    st = wait_idle(mgmt)
    rss1 = rss_bytes(pid) if pid else None
    after = probe(url)

    stayed = [o for o in outcomes if o.disconnect_at is None]
    failed = [o for o in stayed if not (o.status == 200 and o.finished and not o.error)]
    left = [o for o in outcomes if o.disconnect_at is not None]
    left_errors = [o for o in left if o.error or (o.status not in (None, 200))]
    ttft = [o.ttft for o in outcomes if o.ttft is not None]
    e2e = [o.e2e for o in stayed if o.e2e is not None]
    bad, seen = log_lines(log, log_offset) if log else (None, None)
    r = {
        "requests": len(outcomes), "clients": args.clients, "disconnected": len(left),
        "disconnected_before_first_token": sum(1 for o in left if o.disconnect_at == 0),
        "completed": len(stayed) - len(failed), "failed": len(failed),
        "first_failure": (failed[0].error or f"status {failed[0].status}") if failed else "",
        "disconnect_errors": len(left_errors), "disconnects_logged": seen,
        "wall_s": round(wall, 2), "req_s": round(len(outcomes) / wall, 2),
        "tokens": sum(o.frames for o in outcomes),
        "ttft_p50_ms": round(1e3 * percentile(ttft, 50), 1), "ttft_p99_ms": round(1e3 * percentile(ttft, 99), 1),
        "e2e_p50_ms": round(1e3 * percentile(e2e, 50), 1), "e2e_p99_ms": round(1e3 * percentile(e2e, 99), 1),
        "running": st["requests"]["running"], "waiting": st["requests"]["waiting"],
        "in_flight": st["requests"]["in_flight"], "blocks_total": st["blocks"]["total"],
        "blocks_free": st["blocks"]["free"], "rss_start_mb": rss0 and round(rss0 / 2**20, 1),
        "rss_end_mb": rss1 and round(rss1 / 2**20, 1),
        "rss_change": (rss1 - rss0) / rss0 if rss0 and rss1 else None,
        "probes_unchanged": before == after, "probes_before": before, "probes_after": after,
        "bad_log_lines": bad[:20] if bad is not None else None,
    }
    r["checks"] = {
        "idle": r["running"] == 0 and r["waiting"] == 0 and r["in_flight"] == 0,
        "no_blocks_held": r["blocks_free"] == r["blocks_total"],
        "rss_within_tolerance": None if r["rss_change"] is None else abs(r["rss_change"]) <= args.rss_tolerance,
        "probes_unchanged": r["probes_unchanged"],
        "log_clean": None if bad is None else not bad,
        "all_others_completed": not failed and not left_errors,
    }
    r["ok"] = all(v is not False for v in r["checks"].values())
    return r


def report(r: dict[str, Any]) -> None:
    print(f"{r['requests']} streaming requests from {r['clients']} clients: {r['disconnected']} disconnected "
          f"({r['disconnected_before_first_token']} before the first token), {r['completed']} completed, "
          f"{r['failed']} failed{': ' + r['first_failure'] if r['failed'] else ''}")
    if r["disconnects_logged"] is not None:
        print(f"the server logged {r['disconnects_logged']} disconnects (a client that leaves after its last "
              f"frame, or before its request was read, is not one)")
    print(f"held {r['req_s']} requests/s over {r['wall_s']} s ({r['tokens']} tokens streamed); "
          f"TTFT p50 {r['ttft_p50_ms']} ms p99 {r['ttft_p99_ms']} ms; e2e p50 {r['e2e_p50_ms']} ms "
          f"p99 {r['e2e_p99_ms']} ms")
    print(f"after: running {r['running']}, waiting {r['waiting']}, in flight {r['in_flight']}, "
          f"KV blocks free {r['blocks_free']}/{r['blocks_total']}")
    if r["rss_change"] is not None:
        print(f"server RSS {r['rss_start_mb']} MB after warm-up -> {r['rss_end_mb']} MB "
              f"({100 * r['rss_change']:+.2f}%)")
    print(f"greedy probes unchanged: {r['probes_unchanged']}")
    if r["bad_log_lines"] is not None:
        print(f"ERROR/CRITICAL/traceback lines in the server log: {len(r['bad_log_lines'])}")
        for line in r["bad_log_lines"][:5]:
            print(f"  {line[:200]}")
    for name, ok in r["checks"].items():
        print(f"  {'PASS' if ok else ('skip' if ok is None else 'FAIL')}  {name}")
    print("leaks found: none" if r["ok"] else "CHECKS FAILED")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models" / "tiny"),
                    help="checkpoint folder (a demo preset's is built if missing): start a plain-HTTP server")
    ap.add_argument("--url", help="business URL of a running server instead")
    ap.add_argument("--management-url", help="its management URL (default: --url)")
    ap.add_argument("--pid", type=int, help="its process id (for the RSS check)")
    ap.add_argument("--log", help="its log file (for the log check)")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=0, help="warm-up requests (default: max(2 x clients, 10%%))")
    ap.add_argument("--disconnect-share", type=float, default=1 / 3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rss-tolerance", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = ap.parse_args(argv)
    args.warmup = args.warmup or max(2 * args.clients, args.requests // 10)
    proc = None
    tmp = tempfile.TemporaryDirectory(prefix="load_faults_")
    try:
        if args.url:
            url, mgmt = args.url.rstrip("/"), (args.management_url or args.url).rstrip("/")
            pid, log = args.pid, Path(args.log) if args.log else None
        else:
            proc, url, mgmt, log = start_server(Path(args.model), args.clients, Path(tmp.name))
            pid = proc.pid
        r = measure(args, url, mgmt, pid, log)
        print(json.dumps(r)) if args.json else report(r)
        return 0 if r["ok"] else 1
    finally:
        if proc is not None:
            stop_process(proc, 60)
        tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())

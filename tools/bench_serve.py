#!/usr/bin/env python3
"""Load test of the HTTP server: N concurrent streaming clients, each sending requests back to back.

Prints, per concurrency level: requests/s, output tokens/s, time to first token p50/p99 and
inter-token latency p50/p99 (client side, from the SSE frames as they arrive).

Against a running server:   tools/bench_serve.py --url http://127.0.0.1:1025 [--cacert CA --cert C --key K]
Against one it starts:      tools/bench_serve.py --model models/small        (plain HTTP on free ports)
                            tools/bench_serve.py --config conf/config.json   (that config as is)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.server_utils import free_port, percentile  # noqa: E402

WORDS = ("river mountain city garden teacher window morning silver quiet market engine story harbor lantern "
         "winter bridge orange violin forest letter museum thunder candle meadow pilot ocean castle rabbit").split()


@dataclass
class Sample:
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    tokens: int = 0
    ok: bool = False
    error: str = ""



def prompts(n: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)).capitalize() for _ in range(n)]


async def one_request(session: aiohttp.ClientSession, url: str, route: str, prompt: str, max_new: int) -> Sample:
    s = Sample()
    body: dict = {"inputs": prompt, "parameters": {"max_new_tokens": max_new}}
    if route == "/":
        body["stream"] = True
    t0 = last = time.perf_counter()
    try:
        async with session.post(url + route, json=body) as resp:
            if resp.status != 200:
                s.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return s
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                frame = json.loads(line[5:])
                if "error" in frame:
                    s.error = frame["error"]
                    return s
                now = time.perf_counter()
                if s.ttft is None:
                    s.ttft = now - t0
                else:
                    s.itl.append(now - last)
                last = now
                s.tokens += 1
                if frame.get("generated_text") is not None:
                    s.ok = True
    except aiohttp.ClientError as e:
        s.error = f"{type(e).__name__}: {e}"
    return s


async def run_level(url: str, route: str, concurrency: int, n_requests: int, max_new: int, words: int,
                    ssl_ctx: ssl.SSLContext | None) -> dict:
    todo = prompts(n_requests, words, seed=concurrency)
    queue: asyncio.Queue[str] = asyncio.Queue()
    for p in todo:
        queue.put_nowait(p)
    samples: list[Sample] = []
    conn = aiohttp.TCPConnector(limit=concurrency, ssl=ssl_ctx if ssl_ctx is not None else False)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=3600)) as session:
        await one_request(session, url, route, "warm up", 2)

        async def worker() -> None:
            while not queue.empty():
                samples.append(await one_request(session, url, route, queue.get_nowait(), max_new))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    ok = [s for s in samples if s.ok]
    errors = [s.error for s in samples if not s.ok]
    ttft = [s.ttft for s in ok if s.ttft is not None]
    itl = [x for s in ok for x in s.itl]
    return {"concurrency": concurrency, "requests": len(ok), "failed": len(errors), "first_error": errors[0] if errors else "",
            "wall_s": wall, "req_s": len(ok) / wall, "tok_s": sum(s.tokens for s in ok) / wall,
            "tokens": sum(s.tokens for s in ok),
            "ttft_p50_ms": 1e3 * percentile(ttft, 50), "ttft_p99_ms": 1e3 * percentile(ttft, 99),
            "itl_p50_ms": 1e3 * percentile(itl, 50), "itl_p99_ms": 1e3 * percentile(itl, 99)}


# -- starting a server -------------------------------------------------------------------------------
def _model_config(model: str, max_batch: int, out: Path) -> Path:
    port, mport, xport = free_port(), free_port(), free_port()
    cfg = {"ServerConfig": {"ipAddress": "127.0.0.1", "managementIpAddress": "127.0.0.1", "port": port,
                            "managementPort": mport, "metricsPort": xport, "httpsEnabled": False, "maxLinkNum": 1000},
           "BackendConfig": {"tokenizerProcessNumber": 1, "ModelDeployConfig": {
               "maxSeqLen": 2048, "maxInputTokenLen": 1024,
               "ModelConfig": [{"modelName": Path(model).name, "modelWeightPath": str(Path(model).absolute())}]},
               "ScheduleConfig": {"cacheBlockSize": 16, "maxBatchSize": max_batch,
                                  "maxPrefillBatchSize": min(16, max_batch), "maxIterTimes": 1024,
                                  "maxPreemptCount": max_batch}}}
    out.write_text(json.dumps(cfg))
    return out


def start_server(config: Path, log: Path) -> tuple[subprocess.Popen, str]:
    srv = json.loads(config.read_text()).get("ServerConfig", {})
    if srv.get("httpsEnabled", True):
        sys.exit("bench_serve starts plain-HTTP servers only; start an HTTPS one yourself and pass --url and certs")
    url = f"http://{srv.get('ipAddress', '127.0.0.1')}:{srv.get('port', 1025)}"
    mgmt = f"http://{srv.get('managementIpAddress', srv.get('ipAddress', '127.0.0.1'))}:{srv.get('managementPort', 1026)}"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.Popen([sys.executable, "-m", "mindie_service", "serve", "--config", str(config)], cwd=ROOT,
                            env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    import urllib.request

    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(mgmt + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.3)
    proc.kill()
    sys.exit(f"server not ready; see {log}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", help="base URL of a running server (business port)")
    src.add_argument("--model", help="checkpoint folder: start a plain-HTTP server for it")
    src.add_argument("--config", help="config.json: start a server with it (httpsEnabled false)")
    ap.add_argument("--concurrency", default="1,8,32", help="comma-separated client counts")
    ap.add_argument("--requests", type=int, default=0, help="requests per level (default: max(8, 2 x concurrency))")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=32)
    ap.add_argument("--route", default="/", choices=["/", "/generate_stream"])
    ap.add_argument("--cacert")
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--json", action="store_true", help="print one JSON line per level")
    args = ap.parse_args()

    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    proc = None
    tmp = tempfile.TemporaryDirectory(prefix="bench_serve_")
    url = args.url
    if url is None:
        cfg = Path(args.config) if args.config else _model_config(args.model, max(levels), Path(tmp.name) / "config.json")
        proc, url = start_server(cfg, Path(tmp.name) / "server.log")
        print(f"# started a server at {url} (log {tmp.name}/server.log)", flush=True)
    ssl_ctx = None
    if url.startswith("https"):
        ssl_ctx = ssl.create_default_context(cafile=args.cacert)
        if args.cert:
            ssl_ctx.load_cert_chain(args.cert, args.key)
    try:
        if not args.json:
            print(f"# route {args.route}, {args.prompt_words}-word prompts, max_new_tokens {args.max_new_tokens}")
            print(f"{'clients':>7} {'reqs':>5} {'fail':>4} {'req/s':>7} {'out tok/s':>9} {'TTFT p50':>9} "
                  f"{'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8}  (ms)")
        for c in levels:
            n = args.requests or max(8, 2 * c)
            r = asyncio.run(run_level(url, args.route, c, n, args.max_new_tokens, args.prompt_words, ssl_ctx))
            if args.json:
                print(json.dumps(r), flush=True)
            else:
                print(f"{c:>7} {r['requests']:>5} {r['failed']:>4} {r['req_s']:>7.2f} {r['tok_s']:>9.1f} "
                      f"{r['ttft_p50_ms']:>9.1f} {r['ttft_p99_ms']:>9.1f} {r['itl_p50_ms']:>8.1f} "
                      f"{r['itl_p99_ms']:>8.1f}", flush=True)
                if r["failed"]:
                    print(f"#   first error: {r['first_error']}")
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

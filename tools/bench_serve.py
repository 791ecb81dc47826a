#!/usr/bin/env python3
"""Load test of the HTTP server: N concurrent streaming clients, each sending requests back to back.

Prints, per concurrency level: requests/s, output tokens/s, time to first token p50/p99 and
inter-token latency p50/p99 (client side, from the SSE frames as they arrive).

Against a running server:   tools/bench_serve.py --url http://127.0.0.1:1025 [--cacert CA --cert C --key K]
Against one it starts:      tools/bench_serve.py --model models/small        (plain HTTP on free ports)
                            tools/bench_serve.py --config conf/config.json   (that config as is)

Workloads: ``random`` (default) = distinct prompts of --prompt-words words; ``shared-prefix`` = each prompt is
one of --system-prompts long system prompts (--system-words words each) followed by a short question, the
system prompt drawn at random: many requests over a few long prefixes.

Instance routing, prefix vs least loaded, in one run (--model only): --instances 2 --routing prefix,leastLoaded
starts one server per routing (BackendConfig.instanceRouting; same config otherwise, --kv-blocks per
instance), runs the same levels against each, and prints the ratios prefix / leastLoaded.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
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

from tests.server_utils import free_port, percentile, stop_process  # noqa: E402

WORDS = ("river mountain city garden teacher window morning silver quiet market engine story harbor lantern "
         "winter bridge orange violin forest letter museum thunder candle meadow pilot ocean castle rabbit").split()


@dataclass
class Sample:
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    tokens: int = 0
    ok: bool = False
    error: str = ""



def prompts(n: int, words: int, seed: int, workload: str = "random", systems: int = 4,
            system_words: int = 200) -> list[str]:
    rng = random.Random(seed)
    if workload == "random":
        return [" ".join(rng.choice(WORDS) for _ in range(words)).capitalize() for _ in range(n)]
    srng = random.Random(12345)  # the same system prompts at every level and for every server
    heads = [f"System {k}: " + " ".join(srng.choice(WORDS) for _ in range(system_words)) for k in range(systems)]
    return [rng.choice(heads) + " Question: " + " ".join(rng.choice(WORDS) for _ in range(words)) + "?"
            for _ in range(n)]


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
                    ssl_ctx: ssl.SSLContext | None, workload: tuple[str, int, int] = ("random", 0, 0)) -> dict:
    todo = prompts(n_requests, words, concurrency, *workload)
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
def _model_config(model: str, max_batch: int, out: Path, instances: int = 1, routing: str = "prefix",
                  kv_blocks: int | None = None) -> Path:
    port, mport, xport = free_port(), free_port(), free_port()
    cfg = {"ServerConfig": {"ipAddress": "127.0.0.1", "managementIpAddress": "127.0.0.1", "port": port,
                            "managementPort": mport, "metricsPort": xport, "httpsEnabled": False, "maxLinkNum": 1000},
           "BackendConfig": {"tokenizerProcessNumber": 1, "ModelDeployConfig": {
               "maxSeqLen": 2048, "maxInputTokenLen": 1024,
               "ModelConfig": [{"modelName": Path(model).name, "modelWeightPath": str(Path(model).absolute())}]},
               "ScheduleConfig": {"cacheBlockSize": 16, "maxBatchSize": max_batch,
                                  "maxPrefillBatchSize": min(16, max_batch), "maxIterTimes": 1024,
                                  "maxPreemptCount": max_batch, "numKvBlocks": kv_blocks}}}
    cfg["BackendConfig"].update(modelInstanceNumber=instances, npuDeviceIds=[[0]] * instances,
                                instanceRouting=routing)
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


def _print_row(c: int, r: dict, as_json: bool, label: str) -> None:
    if as_json:
        print(json.dumps({"server": label, **r}), flush=True)
        return
    print(f"{label:>11} {c:>7} {r['requests']:>5} {r['failed']:>4} {r['req_s']:>7.2f} {r['tok_s']:>9.1f} "
          f"{r['ttft_p50_ms']:>9.1f} {r['ttft_p99_ms']:>9.1f} {r['itl_p50_ms']:>8.1f} {r['itl_p99_ms']:>8.1f}",
          flush=True)
    if r["failed"]:
        print(f"#   first error: {r['first_error']}")


def _status(config: Path) -> dict:
    import urllib.request

    srv = json.loads(config.read_text()).get("ServerConfig", {})
    url = f"http://{srv.get('managementIpAddress', '127.0.0.1')}:{srv.get('managementPort', 1026)}/v1/status"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _run_target(args: argparse.Namespace, label: str, url: str | None, cfg: Path | None, tmp: Path,
                ssl_ctx: ssl.SSLContext | None, levels: list[int]) -> list[dict]:
    proc = None
    if url is None:
        assert cfg is not None
        proc, url = start_server(cfg, tmp / f"server-{label}.log")
        print(f"# {label}: started a server at {url} (log {tmp}/server-{label}.log)", flush=True)
    out: list[dict] = []
    try:
        for c in levels:
            n = args.requests or max(8, 2 * c)
            r = asyncio.run(run_level(url, args.route, c, n, args.max_new_tokens, args.prompt_words, ssl_ctx,
                                      (args.workload, args.system_prompts, args.system_words)))
            _print_row(c, r, args.json, label)
            out.append(r)
        if cfg is not None:
            st = _status(cfg)
            routed = [i["requests"].get("routed") for i in st.get("instances", [])]
            print(f"# {label}: prefix-cache hit rate {st['prefixCacheHitRate']:.2f}, requests per instance "
                  f"{routed}", flush=True)
    finally:
        if proc is not None:
            stop_process(proc, 60)
    return out


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", help="base URL of a running server (business port)")
    src.add_argument("--model", help="checkpoint folder: start a plain-HTTP server for it")
    src.add_argument("--config", help="config.json: start a server with it (httpsEnabled false)")
    ap.add_argument("--concurrency", default="1,8,32", help="comma-separated client counts")
    ap.add_argument("--requests", type=int, default=0, help="requests per level (default: max(8, 2 x concurrency))")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=32)
    ap.add_argument("--workload", default="random", choices=["random", "shared-prefix"])
    ap.add_argument("--system-prompts", type=int, default=4, help="shared-prefix: distinct system prompts")
    ap.add_argument("--system-words", type=int, default=200, help="shared-prefix: words per system prompt")
    ap.add_argument("--instances", type=int, default=1, help="--model: modelInstanceNumber")
    ap.add_argument("--routing", default="prefix", help="--model: instanceRouting values, comma-separated; "
                    "one server each, same workload, ratios printed")
    ap.add_argument("--kv-blocks", type=int, default=None, help="--model: numKvBlocks of each instance")
    ap.add_argument("--route", default="/", choices=["/", "/generate_stream"])
    ap.add_argument("--cacert")
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--json", action="store_true", help="print one JSON line per level")
    return ap.parse_args()


def main() -> int:
    args = _args()
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    tmp = tempfile.TemporaryDirectory(prefix="bench_serve_")
    base = Path(tmp.name)
    if args.url:
        targets = [("url", args.url, None)]
    elif args.config:
        targets = [("config", None, Path(args.config))]
    else:
        targets = [(r, None, _model_config(args.model, max(levels), base / f"config-{r}.json", args.instances, r,
                                           args.kv_blocks)) for r in args.routing.split(",") if r]
    ssl_ctx = None
    if args.url and args.url.startswith("https"):
        ssl_ctx = ssl.create_default_context(cafile=args.cacert)
        if args.cert:
            ssl_ctx.load_cert_chain(args.cert, args.key)
    if not args.json:
        print(f"# route {args.route}, workload {args.workload}, {args.prompt_words}-word prompts"
              + (f" after one of {args.system_prompts} {args.system_words}-word system prompts"
                 if args.workload == "shared-prefix" else "") + f", max_new_tokens {args.max_new_tokens}")
        print(f"{'server':>11} {'clients':>7} {'reqs':>5} {'fail':>4} {'req/s':>7} {'out tok/s':>9} {'TTFT p50':>9} "
              f"{'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8}  (ms)")
    try:
        results = {label: _run_target(args, label, url, cfg, base, ssl_ctx, levels) for label, url, cfg in targets}
    finally:
        tmp.cleanup()
    if len(results) == 2:
        (a, ra), (b, rb) = results.items()
        for c, x, y in zip(levels, ra, rb):
            print(f"# {a} / {b} at {c} clients: TTFT p50 {x['ttft_p50_ms'] / max(y['ttft_p50_ms'], 1e-9):.2f}x, "
                  f"TTFT p99 {x['ttft_p99_ms'] / max(y['ttft_p99_ms'], 1e-9):.2f}x, "
                  f"output tok/s {x['tok_s'] / max(y['tok_s'], 1e-9):.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Concurrent image requests against the real server on the tiny-vl demo model (LLaVA).

Each request sends one PNG as a base64 data: URI plus a short text to POST / (non-stream, greedy,
16 new tokens). Prints, per concurrency level, images/s and end-to-end latency p50/p99, and the
same for text-only requests measured in the same run (the peer: what media costs on top)."""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mindie_service.devkit.presets import build_demo_model  # noqa: E402
from mindie_service.devkit import synth  # noqa: E402
from tools.bench_serve import _model_config, pct, start_server  # noqa: E402


async def _level(url: str, body_for, concurrency: int, n: int) -> tuple[float, list[float]]:
    lat: list[float] = []
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession() as s:
        async def one(i: int) -> None:
            async with sem:
                t = time.perf_counter()
                async with s.post(url + "/", json=body_for(i)) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"HTTP {r.status}: {await r.text()}")
                lat.append(time.perf_counter() - t)
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return n / (time.perf_counter() - t0), lat


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--requests", type=int, default=32)
    args = ap.parse_args()
    model = build_demo_model("tiny-vl", str(ROOT / "models" / "tiny-vl"), if_missing=True)
    images = [base64.b64encode(synth.image_bytes(64 + i, 48, "PNG")).decode() for i in range(8)]
    params = {"max_new_tokens": 16, "do_sample": False}

    def image_body(i: int) -> dict:
        return {"inputs": [{"type": "image_url", "image_url": "data:image/png;base64," + images[i % len(images)]},
                           {"type": "text", "text": f"Describe picture {i}."}], "parameters": params}

    def text_body(i: int) -> dict:
        return {"inputs": f"Describe picture {i}.", "parameters": params}

    with tempfile.TemporaryDirectory() as tmp:
        cfg = _model_config(str(model), 32, Path(tmp) / "config.json")
        proc, url = start_server(cfg, Path(tmp) / "server.log")
        try:
            for c in (int(x) for x in args.concurrency.split(",")):
                ips, lat = asyncio.run(_level(url, image_body, c, args.requests))
                tps, tlat = asyncio.run(_level(url, text_body, c, args.requests))
                print(json.dumps({"concurrency": c, "images_per_s": round(ips, 2),
                                  "image_e2e_p50_ms": round(pct(lat, 50) * 1000, 1),
                                  "image_e2e_p99_ms": round(pct(lat, 99) * 1000, 1),
                                  "text_req_per_s": round(tps, 2), "text_e2e_p50_ms": round(pct(tlat, 50) * 1000, 1),
                                  "image_vs_text_throughput": round(ips / tps, 2)}))
        finally:
            proc.terminate()
            proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())

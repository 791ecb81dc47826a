#!/usr/bin/env python3
"""Many models on one server (issue 46): three catalog models (copies of a demo model under three ids) and a
``modelMemoryBudget`` that fits two and a third's load (3 x the header estimate: a load counts its peak), 8 clients rotating over the three for ``--duration`` seconds, each request a
streamed greedy completion naming one of them. Prints, and writes as JSON (``--out``):

- 5xx answers, requests lost (no answer, or a stream without its end), 429s;
- the most catalog models resident at once, from /v1/status sampled every 100 ms (never above two);
- the server's RSS against its base plus the budget (never above); the base is its RSS after the reference
  answers (the runtime started by the first load) less what its resident models hold then (8 clients streaming
  from the StandardMock default model move it by under 0.1 MiB: the clients' own load is not what goes over);
- token identity: every answer against the same prompt served by that model alone, before the rotation;
- loads and evictions (the metrics port), and p50 / p99 time to first token of requests that found their model
  loaded and of those that waited for a load (the server's ``X-Model-Load-Wait`` header says which).

Real figures are measured on a quiet machine; a smoke run: ``--duration 5``.

    PYTHONPATH=$PWD .venv/bin/python tools/bench_models.py [--duration 60] [--clients 8] [--model models/tiny]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.server_utils import ServerProcess, percentile, write_config  # noqa: E402

IDS = ("m1", "m2", "m3")
PROMPTS = ("River mountain", "City garden lake", "Winter morning bread")


@dataclass
class Tally:
    """What the clients saw (one lock: appended from every client thread)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    ok: int = 0
    server_errors: int = 0
    overloaded: int = 0
    lost: int = 0
    mismatched: list[str] = field(default_factory=list)
    ttft_loaded: list[float] = field(default_factory=list)
    ttft_load: list[float] = field(default_factory=list)


def stream(srv: ServerProcess, model: str, prompt: str,
           max_tokens: int) -> tuple[int, str, float | None, bool, bool]:
    """(status, text, seconds to the first token, whether the stream ended with [DONE], whether the request waited
    for its model's load: the server's X-Model-Load-Wait header)."""
    t0 = time.monotonic()
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    with requests.post(srv.url() + "/v1/completions", json=body, stream=True, timeout=300) as r:
        waited = "X-Model-Load-Wait" in r.headers
        if r.status_code != 200:
            return r.status_code, "", None, True, waited
        text, first, done = "", None, False
        for line in r.iter_lines():
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                done = True
                break
            frame = json.loads(line[6:])
            delta = frame["choices"][0]["text"] if frame.get("choices") else ""
            if delta and first is None:
                first = time.monotonic() - t0
            text += delta
        return 200, text, first, done, waited


class Sampler(threading.Thread):
    """Every 100 ms: the catalog models resident per /v1/status, and the server's RSS."""

    def __init__(self, srv: ServerProcess) -> None:
        super().__init__(daemon=True)
        self.srv, self.stop = srv, threading.Event()
        self.max_resident, self.max_rss = 0, 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                res = self.srv.get("/v1/status", "management", timeout=10).json()["residency"]
                models = [m for m in res["models"] if m["id"] in IDS]
                resident = [m for m in models if m["state"] in ("starting", "running", "stopping")]
                self.max_resident = max(self.max_resident, len(resident))
            except (requests.RequestException, KeyError, ValueError):
                pass
            self.max_rss = max(self.max_rss, rss(self.srv))
            self.stop.wait(0.1)


def rss(srv: ServerProcess) -> int:
    for line in Path(f"/proc/{srv.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def client(k: int, srv: ServerProcess, refs: dict[tuple[str, str], str], tally: Tally, until: float,
           max_tokens: int) -> None:
    n = 0
    while time.monotonic() < until:
        model, prompt = IDS[(k + n) % len(IDS)], PROMPTS[(k + 2 * n) % len(PROMPTS)]
        n += 1
        try:
            code, text, ttft, done, waited = stream(srv, model, prompt, max_tokens)
        except (requests.RequestException, ValueError):
            code, text, ttft, done, waited = -1, "", None, False, False
        with tally.lock:
            if code == -1 or not done:
                tally.lost += 1
            elif code >= 500:
                tally.server_errors += 1
            elif code == 429:
                tally.overloaded += 1
            elif code == 200:
                tally.ok += 1
                if text != refs[(model, prompt)]:
                    tally.mismatched.append(f"{model} {prompt!r}: {text!r} != {refs[(model, prompt)]!r}")
                if ttft is not None:
                    (tally.ttft_load if waited else tally.ttft_loaded).append(ttft)


def metric_sum(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and any(f'model_name="{m}"' in line for m in IDS))


def setup(work: Path, model: Path, budget: int) -> Path:
    models = work / "models"
    models.mkdir(parents=True)
    for mid in IDS:
        shutil.copytree(model, models / mid)
    return write_config(work / "config.json", model, model_name="mock",
                        server={"modelMemoryBudget": str(budget), "modelLoadTimeoutSeconds": 120},
                        deploy={"modelsDir": str(models), "ModelConfig": [
                            {"modelName": "mock", "modelWeightPath": str(model), "modelInstanceType": "StandardMock"}]},
                        schedule={"numKvBlocks": 512})


def one_model_bytes(model: Path) -> int:
    """The header estimate of one copy as the server configures it (the budget is three of them: see ``run``)."""
    from mindie_service.catalog.fit_estimate import loaded_estimate
    from mindie_service.engine.configs.engine_config import EngineConfig

    cfg = EngineConfig(model=str(model), cache_block_size=16, num_kv_blocks=512, max_seq_len=512,
                       max_input_token_len=256)
    return loaded_estimate(model, cfg)


def references(srv: ServerProcess, max_tokens: int) -> dict[tuple[str, str], str]:
    """Each (model, prompt) served with nothing else in flight: the answers the rotation must reproduce."""
    out = {}
    for mid in IDS:
        for p in PROMPTS:
            code, text, _, done, _ = stream(srv, mid, p, max_tokens)
            assert code == 200 and done, (mid, p, code)
            out[(mid, p)] = text
    return out


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    model = Path(args.model).resolve()
    each = one_model_bytes(model)
    # Two resident models, and the peak of a load beside one of them (the server counts a load's measured peak:
    # its checkpoint's pages while read come on top of what stays), fit; three models do not.
    budget = int(each * 3)
    srv = ServerProcess(setup(work, model, budget), work / "server.log").start().wait_ready()
    try:
        refs = references(srv, args.max_tokens)
        # The server's base: its RSS now (the runtime started by the first load) less what its resident models hold
        base = rss(srv) - srv.get("/v1/status", "management").json()["residency"]["held_bytes"]
        sampler, tally = Sampler(srv), Tally()
        sampler.start()
        until = time.monotonic() + args.duration
        threads = [threading.Thread(target=client, args=(k, srv, refs, tally, until, args.max_tokens))
                   for k in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sampler.stop.set()
        sampler.join()
        metrics = srv.get("/metrics", "metrics").text
    finally:
        srv.stop()
    return {
        "duration_s": args.duration, "clients": args.clients, "budget_bytes": budget, "estimate_per_model": each,
        "ok": tally.ok, "5xx": tally.server_errors, "429": tally.overloaded, "lost": tally.lost,
        "token_mismatches": len(tally.mismatched), "mismatch_examples": tally.mismatched[:3],
        "max_resident": sampler.max_resident, "rss_base": base, "rss_max": sampler.max_rss,
        "rss_over_budget_plus_base": max(0, sampler.max_rss - base - budget),
        "loads": metric_sum(metrics, "model_loads_total"), "evictions": metric_sum(metrics, "model_evictions_total"),
        "ttft_loaded_p50_s": percentile(tally.ttft_loaded, 50), "ttft_loaded_p99_s": percentile(tally.ttft_loaded, 99),
        "ttft_with_load_p50_s": percentile(tally.ttft_load, 50), "ttft_with_load_p99_s": percentile(tally.ttft_load, 99),
        "requests_loaded": len(tally.ttft_loaded), "requests_with_load": len(tally.ttft_load),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--model", default=str(Path(__file__).resolve().parents[1] / "models" / "tiny"))
    ap.add_argument("--out", type=Path, default=None, help="also write the figures here as JSON")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_models.") as tmp:
        out = run(args, Path(tmp))
    for k, v in out.items():
        print(f"{k:28s} {v}")
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=2))
    ok = out["5xx"] == 0 and out["lost"] == 0 and out["max_resident"] <= 2 and out["token_mismatches"] == 0
    sys.exit(0 if ok and out["rss_over_budget_plus_base"] == 0 else 1)


if __name__ == "__main__":
    main()

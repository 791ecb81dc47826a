#!/usr/bin/env python3
"""``guidellm run`` (vLLM's benchmark client, guidellm 0.8.x) against this server, unmodified, streaming: a
constant-rate run and a sweep, each bounded by --seconds. It sends vLLM's fields (``ignore_eos``,
``stream_options.continuous_usage_stats``) on /v1/completions or /v1/chat/completions; every request must
succeed. Prints guidellm's summary and one JSON line of figures per profile.

guidellm pins click ~= 8.4 (the project's venv has a newer click), so it runs from a venv of its own; this tool
takes its executable (--guidellm) and is not a test. One way to make that venv without touching the project's:

    python -m venv --system-site-packages /tmp/gl-venv && /tmp/gl-venv/bin/pip install guidellm==0.8.1

Against a server it starts (plain HTTP, small KV pool):
    tools/guidellm_check.py --guidellm /tmp/gl-venv/bin/guidellm --model models/tiny --seconds 60
Against a running server (its tokenizer folder for guidellm's synthetic prompts):
    tools/guidellm_check.py --guidellm ... --url http://127.0.0.1:1025 --model models/small
Smoke run:  tools/guidellm_check.py --guidellm ... --model models/tiny --seconds 5 --profiles constant
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.server_utils import ServerProcess, write_config  # noqa: E402


def _profile(kind: str, rate: float) -> str:
    return f"kind=constant,rate={rate:g}" if kind == "constant" else "kind=sweep,sweep_size=3"


def run_guidellm(exe: str, url: str, model: Path, kind: str, args: argparse.Namespace, out: Path) -> dict:
    """One ``guidellm run``; its JSON report's per-benchmark request counts and medians (raises on failure)."""
    report = out / f"{kind}.json"
    cmd = [exe, "run", "--backend", f"kind=openai_http,target={url},request_format={args.request_format}",
           "--profile", _profile(kind, args.rate),
           "--constraint", f"kind=max_duration,seconds={args.seconds:g}",
           "--data", f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},output_tokens={args.output_tokens}",
           "--tokenizer", f"kind=huggingface_auto,model={model.absolute()}",
           "--output", f"kind=json,path={report}", "--disable-console-interactive"]
    proc = subprocess.run(cmd, cwd=out, text=True, capture_output=True, timeout=args.seconds * 20 + 300)
    sys.stderr.write(proc.stdout[-6000:] + proc.stderr[-4000:])
    if proc.returncode != 0:
        raise SystemExit(f"guidellm {kind}: exit {proc.returncode}")
    return _figures(json.loads(report.read_text()), kind)


def _figures(report: dict, kind: str) -> dict:
    rows = []
    for b in report.get("benchmarks", []):
        totals = b.get("metrics", {}).get("request_totals", b.get("request_totals", {}))
        m = b.get("metrics", {})

        def med(name: str) -> float | None:
            v = m.get(name, {})
            v = v.get("successful", v) if isinstance(v, dict) else v
            return v.get("median") if isinstance(v, dict) else None

        rows.append({"successful": totals.get("successful"), "errored": totals.get("errored"),
                     "incomplete": totals.get("incomplete"), "ttft_ms_p50": med("time_to_first_token_ms"),
                     "itl_ms_p50": med("inter_token_latency_ms"), "output_tok_s": med("output_tokens_per_second")})
    return {"profile": kind, "benchmarks": rows}


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--guidellm", default="guidellm", help="guidellm's executable (a venv of its own)")
    ap.add_argument("--model", required=True, help="checkpoint folder: served (without --url) and guidellm's tokenizer")
    ap.add_argument("--url", help="base URL of a running plain-HTTP server (business port)")
    ap.add_argument("--profiles", default="constant,sweep")
    ap.add_argument("--rate", type=float, default=1.0, help="constant profile: requests per second")
    ap.add_argument("--seconds", type=float, default=60.0, help="each profile's (each sweep step's) duration")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--request-format", default="/v1/chat/completions",
                    choices=["/v1/chat/completions", "/v1/completions"])
    ap.add_argument("--kv-blocks", type=int, default=512, help="numKvBlocks of the server it starts")
    return ap.parse_args()


def main() -> int:
    args = _args()
    model = Path(args.model)
    with tempfile.TemporaryDirectory(prefix="guidellm_check_") as tmp:
        out = Path(tmp)
        srv = None
        url = args.url
        if url is None:
            # the shipped maxLinkNum (1000, MindIE's): the sweep's throughput step opens hundreds of streams at once,
            # which `make serve` queues; the tests' small value would answer most of them 429
            links = json.loads((ROOT / "conf" / "config.json").read_text())["ServerConfig"]["maxLinkNum"]
            cfg = write_config(out / "config.json", model.absolute(), model_name=model.name,
                               server={"maxLinkNum": links}, schedule={"numKvBlocks": args.kv_blocks})
            srv = ServerProcess(cfg, out / "server.log").start().wait_ready()
            url = srv.url()
        failed = False
        try:
            for kind in [k for k in args.profiles.split(",") if k]:
                res = run_guidellm(args.guidellm, url, model, kind, args, out)
                print(json.dumps(res))
                failed |= any(not r["successful"] or r["errored"] for r in res["benchmarks"])
        finally:
            if srv is not None:
                srv.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

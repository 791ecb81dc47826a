"""What tools/bench_jobs.py (llama-stack batch jobs) and tools/bench_batches.py (OpenAI batches) share: the server
on the small demo model with the shipped config's ScheduleConfig (``--schedule`` / ``--server KEY=JSON``
overrides), the rounds of sequential online requests whose time to first token is measured beside the batch
work, the batch's conversations, and the idle / busy comparison against the goal."""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mindie_service.devkit.presets import build_demo_model  # noqa: E402
from tests.prompts import WORDS, word_prompts  # noqa: E402
from tests.server_utils import ServerProcess, write_config  # noqa: E402

GOAL = 1.3  # busy online TTFT p50 over idle: batch work stays below online traffic


def overrides(pairs: list[str]) -> dict[str, object]:
    return {k: json.loads(v) for k, v in (p.split("=", 1) for p in pairs)}


def add_args(ap: argparse.ArgumentParser, lines: int, max_tokens: int) -> None:
    """The flags both benchmarks take."""
    ap.add_argument("--model", default=str(ROOT / "models" / "small"))
    ap.add_argument("--lines", type=int, default=lines)
    ap.add_argument("--online", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=max_tokens, help="output tokens of each batch line")
    ap.add_argument("--schedule", action="append", default=[], metavar="KEY=JSON")
    ap.add_argument("--server", action="append", default=[], metavar="KEY=JSON")


def start_server(args: argparse.Namespace, tmp: Path, server: dict[str, Any], log: str) -> ServerProcess:
    """The server on ``args.model`` ("small"), ready: the shipped ScheduleConfig and ``server`` under the overrides."""
    schedule = json.loads((ROOT / "conf" / "config.json").read_text())["BackendConfig"]["ScheduleConfig"]
    schedule.update(overrides(args.schedule))
    cfg = write_config(tmp / "config.json", Path(args.model), model_name="small",
                       server={"maxLinkNum": 64, **server, **overrides(args.server)},
                       deploy={"maxSeqLen": 1024, "maxInputTokenLen": 512}, schedule=schedule)
    return ServerProcess(cfg, tmp / log).start().wait_ready(300)


def online_round(ttft: Callable[[str], float], n: int, seed: int) -> list[float]:
    """``n`` sequential short prompts' times to first token (``ttft(prompt)``), at random gaps."""
    rng = random.Random(seed)
    out = []
    for p in word_prompts(n, 8, 40, seed=seed):
        out.append(ttft(p))
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


def compare(before: list[float], busy: list[float], after: list[float], what: str) -> str:
    """The idle p50 (the rounds before and after the batch), the p50 and p90 beside it, their ratio and the goal."""
    idle = statistics.median(before + after)
    ratio = statistics.median(busy) / idle
    return (f"online TTFT p50 idle {idle * 1e3:.1f} ms (before {statistics.median(before) * 1e3:.1f}, after "
            f"{statistics.median(after) * 1e3:.1f}), beside {what} {statistics.median(busy) * 1e3:.1f} ms "
            f"(p90 {statistics.quantiles(busy, n=10)[-1] * 1e3:.1f}): ratio {ratio:.2f}, goal <= {GOAL} "
            f"{'met' if ratio <= GOAL else 'NOT met'}")


def main(doc: str, lines: int, max_tokens: int, run: Callable[[argparse.Namespace, Path], None],
         more: Callable[[argparse.ArgumentParser], None] = lambda ap: None) -> None:
    """Parse the flags (``more`` adds a benchmark's own), build the demo model if missing, ``run`` in a temp dir."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(ap, lines, max_tokens)
    more(ap)
    args = ap.parse_args()
    build_demo_model("small", args.model, if_missing=True)
    with tempfile.TemporaryDirectory() as tmp_s:
        run(args, Path(tmp_s))

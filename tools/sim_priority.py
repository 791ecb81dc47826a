#!/usr/bin/env python3
"""tools/bench_priority.py's scenario replayed on the real scheduler in simulated time: no model, no server, no
wall clock, so the same command gives the same figures on any machine. It shows what the scheduling decisions
cost a high-priority probe (how many steps, and how long they are, it waits for), not what a model takes: a
step's time is a linear model (a fixed cost, plus each prompt token, plus each decode row), to be fitted from a
real run's step times.

Low-priority streams (rank ``--low-rank``) send long prompts back to back; probes (rank ``--urgent-rank``, and with
``--baseline`` rank 0) go one after another, idle first, then under load, each arriving at a step boundary's
inbox read (a probe that arrives during a step waits for it to end). A probe's time to first token is the end of
the step that sampled its first token, less its arrival, plus ``--http-ms`` (the frontend's share).

    tools/sim_priority.py                                  the shipped ScheduleConfig, 32 streams
    tools/sim_priority.py --baseline --interleave          urgent and default probes alternating under one load
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mindie_service.engine.configs.engine_config import EngineConfig  # noqa: E402
from mindie_service.engine.kv.block_manager import BlockManager  # noqa: E402
from mindie_service.engine.sched.bursts import BurstPacer  # noqa: E402
from mindie_service.engine.sched.scheduler import Scheduler  # noqa: E402
from mindie_service.engine.sequence import Sequence  # noqa: E402
from mindie_service.engine.step import SchedulerOutput  # noqa: E402
from mindie_service.sampling_params import SamplingParams  # noqa: E402

_KEYS = {"maxPrefillTokens": "max_prefill_tokens", "maxPrefillBatchSize": "max_prefill_batch_size",
         "maxBatchSize": "max_batch_size", "maxPreemptCount": "max_preempt_count", "cacheBlockSize": "cache_block_size",
         "maxQueueDelayMicroseconds": "max_queue_delay_microseconds", "batchPrefillTokens": "batch_prefill_tokens",
         "batchTokensBesideOnline": "batch_tokens_beside_online", "decodeSteps": "decode_steps",
         "enablePrefixCaching": "enable_prefix_caching"}


class Sim:
    def __init__(self, args: argparse.Namespace) -> None:
        sched = json.loads((ROOT / "conf" / "config.json").read_text())["BackendConfig"]["ScheduleConfig"]
        kw = {f: sched[k] for k, f in _KEYS.items() if k in sched}
        if args.max_prefill_tokens is not None:  # what-if: a shorter step for everyone
            kw["max_prefill_tokens"] = args.max_prefill_tokens
        self.cfg = EngineConfig(model="sim", max_seq_len=4096, max_input_token_len=4095, **kw)
        self.t = 0.0
        self.sched = Scheduler(self.cfg, BlockManager(args.kv_blocks, self.cfg.cache_block_size, False),
                               clock=lambda: self.t)
        self.pacer = BurstPacer(self.cfg.decode_steps)
        self.args, self.rng, self.n = args, random.Random(0), 0
        self.inbox: list[tuple[float, Sequence]] = []
        self.first: dict[str, float] = {}  # request id -> time of its first token

    def submit(self, at: float, prompt: int, out: int, rank: int) -> str:
        self.n += 1
        ids = [self.rng.randrange(4, 1000) for _ in range(prompt)]
        seq = Sequence(f"q{self.n}", ids, SamplingParams(max_tokens=out, temperature=0.0), out, seed=0, rank=rank)
        self.inbox.append((at, seq))
        return seq.request_id

    def cost(self, out: SchedulerOutput) -> float:
        a = self.args
        prompt = sum(c.num_tokens for c in out.prefills)
        rows = sum(c.steps for c in out.decodes)
        return (a.step_ms * max(1, out.chunks[0].steps if out.decodes else 1) + a.prefill_us * prompt / 1e3
                + a.decode_us * rows / 1e3) / 1e3

    def step(self) -> list[str]:
        """Take the inbox, run one step; the ids that finished."""
        for item in [x for x in self.inbox if x[0] <= self.t]:
            self.inbox.remove(item)
            self.sched.add(item[1])
        if not self.sched.has_work():
            self.t = min((x[0] for x in self.inbox), default=self.t + 0.001)
            return []
        out = self.sched.schedule()
        if out.empty:
            self.t += min(out.hold_s, 0.001) if out.hold_s > 0 else 0.001
            return []
        spent = self.cost(out)
        self.t += spent
        if out.num_decodes == len(out.chunks):
            self.sched.decode_steps = self.pacer.observe(spent, out.chunks[0].steps)
        sampled, finished = {}, {}
        for c in out.sampled:
            seq = self.sched.seqs[c.request_id]
            k = min(c.out_rows, seq.max_output - len(seq.output_token_ids))
            sampled[c.request_id] = [1] * k
            self.first.setdefault(c.request_id, self.t)
            if len(seq.output_token_ids) + k >= seq.max_output:
                finished[c.request_id] = "length"
        self.sched.update(out, sampled, finished)
        return list(finished)


def run(args: argparse.Namespace) -> dict:
    """Median TTFT (ms) of the idle, urgent and default probes, and urgent / idle."""
    sim, a = Sim(args), args
    http = a.http_ms / 1e3
    res: dict[str, list[float]] = {"idle": [], "urgent": [], "default": []}
    loaded = ["urgent", "default"] if a.baseline else ["urgent"]
    plan = ["idle"] * a.probes + ([k for _ in range(a.probes) for k in loaded] if a.interleave
                                  else [k for k in loaded for _ in range(a.probes)])
    streams: set[str] = set()
    load = {"done": 0}  # load requests finished
    probe: tuple[str, str, float] | None = None
    warm_until = None
    while plan or probe:
        if probe is None and (warm_until is None or sim.t >= warm_until or plan[0] == "idle"):
            kind = plan.pop(0)
            if kind != "idle" and warm_until is None:  # the load starts; loaded probes after its warm-up
                streams = {sim.submit(sim.t + http, a.prompt_tokens, a.load_tokens, a.low_rank)
                           for _ in range(a.streams)}
                warm_until = sim.t + a.warmup_s
                plan.insert(0, kind)
                continue
            at = sim.t + http + sim.rng.uniform(0, a.jitter_ms / 1e3)
            rank = a.urgent_rank if kind != "default" else 0
            probe = (sim.submit(at, a.probe_tokens, a.probe_out, rank), kind, at)
        for rid in sim.step():
            if rid in streams:
                streams.discard(rid)
                load["done"] += 1
                streams.add(sim.submit(sim.t + http, a.prompt_tokens, a.load_tokens, a.low_rank))
            elif probe is not None and rid == probe[0]:
                res[probe[1]].append((sim.first[rid] - probe[2]) * 1e3 + a.http_ms)
                probe = None
    out: dict[str, float] = {k: round(statistics.median(v), 2) for k, v in res.items() if v}
    out["ratio"] = round(out["urgent"] / out["idle"], 2)
    out["load_done_per_s"] = round(load["done"] / max(1e-9, sim.t - (warm_until or 0) + a.warmup_s), 2)
    return out


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=800, help="a load prompt's tokens")
    ap.add_argument("--load-tokens", type=int, default=128)
    ap.add_argument("--probes", type=int, default=20)
    ap.add_argument("--probe-tokens", type=int, default=16)
    ap.add_argument("--probe-out", type=int, default=8)
    ap.add_argument("--urgent-rank", type=int, default=-10)
    ap.add_argument("--low-rank", type=int, default=10)
    ap.add_argument("--baseline", action="store_true", help="also probe at the default rank under load")
    ap.add_argument("--interleave", action="store_true", help="alternate urgent and default probes")
    ap.add_argument("--warmup-s", type=float, default=10.0)
    ap.add_argument("--jitter-ms", type=float, default=50.0, help="a probe's arrival: up to this after the last")
    ap.add_argument("--kv-blocks", type=int, default=8192)
    ap.add_argument("--max-prefill-tokens", type=int, default=None, help="override the shipped maxPrefillTokens")
    ap.add_argument("--step-ms", type=float, default=2.0, help="a step's fixed cost")
    ap.add_argument("--prefill-us", type=float, default=150.0, help="per prompt token")
    ap.add_argument("--decode-us", type=float, default=250.0, help="per decode row")
    ap.add_argument("--http-ms", type=float, default=8.0, help="added to each TTFT (the frontend's share)")
    return ap.parse_args()


if __name__ == "__main__":
    print(json.dumps(run(_args())))

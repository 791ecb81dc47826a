#!/usr/bin/env python3
"""The cost of sending one step to the tensor-parallel workers, two ways, in one run (gloo, 2 ranks).

- ours (engine/runner/parallel/comm.py): the pickled StepMessage in one broadcast of a fixed 16 KiB buffer
  (a second broadcast only for larger messages);
- torch.distributed.broadcast_object_list: a size broadcast, then the payload.

The message is a decode step of --batch requests with --blocks-per-seq blocks each (plus a prefill
step of 2 x 512 tokens, which exceeds the buffer). Prints microseconds per step (median of --steps) for
both and their ratio. Receivers only receive; nothing else runs.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from mindie_service.engine.runner.parallel.comm import Dist, StepMessage  # noqa: E402
from mindie_service.engine.step import ScheduledChunk, SchedulerOutput  # noqa: E402


def step(batch: int, blocks: int, prefill: bool) -> SchedulerOutput:
    if prefill:
        chunks = [ScheduledChunk(f"req-{i}", 0, tuple(range(512)), tuple(range(i * 40, i * 40 + 32)), True)
                  for i in range(2)]
        return SchedulerOutput(chunks, 0)
    chunks = [ScheduledChunk(f"req-{i}", 300 + i, (1000 + i,), tuple(range(i * blocks, (i + 1) * blocks)), True)
              for i in range(batch)]
    return SchedulerOutput(chunks, batch)


def run(rank: int, port: int, args: argparse.Namespace, out: "mp.Queue") -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timedelta(seconds=60))
    ours = Dist(rank, 2, store, dist.ProcessGroupGloo(dist.PrefixStore("c/", store), rank, 2, timedelta(seconds=60)),
                None)
    dist.init_process_group("gloo", store=dist.PrefixStore("d/", store), rank=rank, world_size=2)
    results = {}
    for prefill in (False, True):
        msg = StepMessage(step(args.batch, args.blocks_per_seq, prefill), ((1, "adapter-a"),))
        for name in ("ours", "broadcast_object_list"):
            times = []
            for _ in range(args.steps):
                dist.barrier()
                t = time.perf_counter()
                if name == "ours":
                    ours.send(msg) if rank == 0 else ours.recv()
                else:
                    box = [msg if rank == 0 else None]
                    dist.broadcast_object_list(box, src=0)
                times.append(time.perf_counter() - t)
            results[(prefill, name)] = statistics.median(times) * 1e6
    if rank == 0:
        out.put(results)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--blocks-per-seq", type=int, default=8)
    ap.add_argument("--steps", type=int, default=500)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, port, args, q)) for r in range(2)]
    for p in procs:
        p.start()
    res = q.get(timeout=600)
    for p in procs:
        p.join()
    size = len(__import__("pickle").dumps(StepMessage(step(args.batch, args.blocks_per_seq, False))))
    print(f"decode step of {args.batch} requests ({size} bytes pickled), median of {args.steps}:")
    for prefill in (False, True):
        o, b = res[(prefill, "ours")], res[(prefill, "broadcast_object_list")]
        kind = "prefill 2 x 512 tokens" if prefill else "decode"
        print(f"  {kind:24s} ours {o:8.1f} us   broadcast_object_list {b:8.1f} us   ratio {b / o:5.2f}x")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()

#!/usr/bin/env python3
"""The process's resident memory before and after an engine loads a model (the offline LLM, its KV pool faulted in
as the server's is), and after one short generate: what issue 44's "RSS after load" compares across builds (run it
with PYTHONPATH at each tree). Memory, not speed: fine on a busy machine.

    PYTHONPATH=$PWD .venv/bin/python tools/rss_load.py [--model PATH] [--blocks 2912]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: the packaged SmolLM2-135M-Instruct Q4_1 .gguf")
    ap.add_argument("--blocks", type=int, default=2912, help="KV blocks of 16 (2912: the shipped config's 2 GiB)")
    args = ap.parse_args()
    from mindie_service import LLM
    from mindie_service.models.packaged_models import packaged_file
    model = args.model or str(packaged_file("SmolLM2-135M-Instruct"))
    before = rss_mib()
    llm = LLM(model, max_seq_len=2048, num_kv_blocks=args.blocks, cache_block_size=16)
    loaded = rss_mib()
    llm.generate([[1, 2, 3, 4]], None, use_tqdm=False)
    print(f"{Path(model).name}: RSS {before:.0f} MiB before the load, {loaded:.0f} MiB after it "
          f"({args.blocks} KV blocks of 16), {rss_mib():.0f} MiB after a generate")


if __name__ == "__main__":
    main()

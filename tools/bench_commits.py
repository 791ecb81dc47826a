#!/usr/bin/env python3
"""Engine throughput of two commits in one run: did a change cost speed?

Checks the base commit out into a temporary git worktree and runs the same engine workload as
tools/bench_engine.py (32 prompts of 16-256 words, 16-128 output tokens, EOS ignored, small demo
model, fp32) in a fresh process per run, alternating base and working tree for ``--rounds`` rounds;
each side keeps its best round. Prints both and their ratio.

    .venv/bin/python tools/bench_commits.py --base HEAD~3 --rounds 3
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs inside the tree under test (its own mindie_service on sys.path); only the public offline API.
SNIPPET = r"""
import random, sys, time
from mindie_service import LLM, SamplingParams
WORDS = sys.argv[2].split()
rng = random.Random(0)
prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(16, 256))) for _ in range(32)]
outs = [rng.randint(16, 128) for _ in range(32)]
llm = LLM(sys.argv[1], dtype="float32", max_batch_size=32, cache_block_size=16)
params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in outs]
wrng = random.Random(-1)
warm = [" ".join(wrng.choice(WORDS) for _ in range(wrng.randint(16, 256))) for _ in range(2)]
llm.generate(warm, params[:2], use_tqdm=False)
t = time.perf_counter()
res = llm.generate(prompts, params, use_tqdm=False)
dt = time.perf_counter() - t
assert [len(r.outputs[0].token_ids) for r in res] == outs
print(sum(outs) / dt)
"""


def run(tree: Path, model: str, words: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    out = subprocess.run([sys.executable, "-c", SNIPPET, model, words], cwd=tree, env=env, check=True,
                         capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the commit to compare the working tree against")
    ap.add_argument("--model", default=str(ROOT / "models" / "small"))
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from mindie_service.devkit.presets import build_demo_model
    from tests.prompts import WORDS

    build_demo_model("small", args.model, if_missing=True)
    words = " ".join(WORDS)
    with tempfile.TemporaryDirectory() as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base_tree), args.base],
                       check=True, capture_output=True)
        try:
            best = {"base": 0.0, "new": 0.0}
            for r in range(args.rounds):
                for name, tree in (("base", base_tree), ("new", ROOT)):
                    tps = run(tree, args.model, words)
                    best[name] = max(best[name], tps)
                    print(f"round {r + 1}: {name} {tps:8.1f} output tok/s", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)], check=False)
    print(f"best of {args.rounds}: base ({args.base}) {best['base']:.1f}, new {best['new']:.1f} output tok/s, "
          f"new / base = {best['new'] / best['base']:.3f}")


if __name__ == "__main__":
    main()

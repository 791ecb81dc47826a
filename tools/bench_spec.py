#!/usr/bin/env python3
"""Speculative decoding on vs off, measured in one run on the same weights and prompts.

Two workloads: input-grounded prompts (rewrite a passage, extract from it, continue a code listing: text
whose answer repeats its input, where n-gram drafts find matches) and open-ended prompts (a story, an
explanation: little to copy). Each at one stream (prompts one after another) and at 16 streams (all in one
batch). Greedy, EOS ignored, --tokens new tokens each. For each cell: output tok/s off and on, the ratio, the
acceptance figures (accepted / draft tokens, mean accepted length per verify row) and whether the outputs
are token-identical (they must be). Each cell first runs once untimed on both engines (kernels built, the
step-cost fit fed); then rounds (--rounds) alternate which engine goes first, each keeps its best.

The n-gram proposer's memory of finished requests is cleared before every timed run, and the prefix cache
is off for both engines: a repeated benchmark prompt must not draft from, or reuse, its own earlier run.

    python tools/bench_spec.py                          # the demo `small` model (random weights)
    python tools/bench_spec.py --model PATH [--draft PATH] [--method ngram|draft_model|both]

On the random-weight demo models the figures show the machinery's overhead and the adaptive cut-off, not
the speed-up a trained model gets on grounded prompts (a random model does not copy its input).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mindie_service import LLM, SamplingParams  # noqa: E402
from mindie_service.devkit.presets import build_demo_model  # noqa: E402

PASSAGE = ("The harbor town of Vell keeps three lighthouses. Mara Quint tends the northern one, Tobias Reed the "
           "eastern one, and the old southern tower has stood empty since the storm of 1911. Every spring the "
           "council votes on whether to restore it, and every spring the vote is tied.")
CODE = '''def area_square(side):
    return side * side


def area_rectangle(width, height):
    return width * height


def area_triangle(base, height):
    return base * height / 2


def perimeter_square(side):
    return 4 * side


def perimeter_rectangle(width, height):
'''
GROUNDED = [
    f"Rewrite the following passage in plain words, keeping every name and number:\n\n{PASSAGE}\n\nRewritten:",
    f"Copy the passage below exactly, then add one sentence at its end.\n\n{PASSAGE}\n\nCopy:",
    f"From the passage, list every person and what they tend, one per line.\n\n{PASSAGE}\n\nList:",
    f"Continue this Python listing with the remaining perimeter and volume functions:\n\n{CODE}",
    f"Quote the sentence of the passage that mentions the storm, then quote the sentence before it.\n\n{PASSAGE}",
    f"Translate this passage into formal English, sentence by sentence:\n\n{PASSAGE}\n\nFormal:",
    f"Fix the style of this code without changing names, and print it whole:\n\n{CODE}",
    f"Summarize then repeat the passage:\n\n{PASSAGE}",
]
OPEN = [
    "Write a short story about a lighthouse keeper who finds a letter.",
    "Explain why the sky is blue to a ten-year-old.",
    "Give three ideas for a weekend trip in the mountains.",
    "What makes a good cup of tea? Answer in a paragraph.",
    "Describe a busy market in the morning.",
    "Write a poem about winter rivers.",
    "List some uses of copper and why it is chosen for each.",
    "Tell me about the history of bridges in a few sentences.",
]


def prompts_for(llm: LLM, texts: list[str], n: int) -> list[str]:
    """``n`` prompts cycling over ``texts``, rendered with the chat template when the tokenizer has one."""
    tok = llm.tokenizer
    out = []
    for i in range(n):
        t = texts[i % len(texts)]
        if getattr(tok, "chat_template", None):
            t = tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
        out.append(t)
    return out


def timed(llm: LLM, prompts: list[str], streams: int, tokens: int) -> tuple[float, list[list[int]]]:
    """Output tok/s over ``prompts`` run ``streams`` at a time, and the tokens."""
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    spec = llm.engine.spec
    if spec is not None:
        spec.ngram.memory.clear()
    t = time.perf_counter()
    outs: list[list[int]] = []
    for i in range(0, len(prompts), streams):
        outs += [r.outputs[0].token_ids for r in llm.generate(prompts[i:i + streams], params, use_tqdm=False)]
    return sum(map(len, outs)) / (time.perf_counter() - t), outs


def counters(llm: LLM) -> tuple[int, int, int]:
    s = llm.engine.stats()
    return s.spec_num_drafts, s.spec_num_draft_tokens, s.spec_num_accepted_tokens


def run(args: argparse.Namespace, model: str, spec_cfg: dict, label: str) -> None:
    common = dict(max_batch_size=32, cache_block_size=16, enable_prefix_caching=False, max_seq_len=2048,
                  max_iter_times=args.tokens)
    off = LLM(model, **common)
    on = LLM(model, **common, speculative_config=spec_cfg)
    print(f"\n== {label}: {spec_cfg}")
    print(f"{'workload':10} {'streams':>7} {'off tok/s':>10} {'on tok/s':>10} {'ratio':>6} {'accept':>7} "
          f"{'mean len':>8} {'drafted/tok':>11} identical")
    for name, texts in (("grounded", GROUNDED), ("open", OPEN)):
        for streams in (1, 16):
            prompts = prompts_for(off, texts, args.prompts_1 if streams == 1 else 16)
            best_off = best_on = 0.0
            same = True
            for llm in (off, on):  # untimed: the kernels of these shapes are built, the step-cost fit fed
                timed(llm, prompts, streams, args.tokens)
            before = counters(on)
            for r in range(args.rounds):
                if r % 2:
                    r_on, t_on = timed(on, prompts, streams, args.tokens)
                    r_off, t_off = timed(off, prompts, streams, args.tokens)
                else:
                    r_off, t_off = timed(off, prompts, streams, args.tokens)
                    r_on, t_on = timed(on, prompts, streams, args.tokens)
                best_off, best_on = max(best_off, r_off), max(best_on, r_on)
                same = same and t_off == t_on
            d, dt, acc = (a - b for a, b in zip(counters(on), before))
            made = args.rounds * len(prompts) * args.tokens
            print(f"{name:10} {streams:>7} {best_off:>10.1f} {best_on:>10.1f} {best_on / best_off:>6.2f} "
                  f"{(acc / dt if dt else 0):>7.2f} {(1 + acc / d if d else 0):>8.2f} {dt / made:>11.2f} "
                  f"{'yes' if same else 'NO'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="checkpoint folder (default: the demo `small` model, built if missing)")
    ap.add_argument("--draft", help="draft checkpoint for --method draft_model (default: demo small-draft)")
    ap.add_argument("--method", choices=("ngram", "draft_model", "both"), default="both")
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per prompt")
    ap.add_argument("--prompts-1", type=int, default=4, help="prompts run one after another at one stream")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    model = args.model or str(build_demo_model("small", ROOT / "models" / "small", if_missing=True))
    if args.method in ("ngram", "both"):
        run(args, model, {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": 4,
                          "prompt_lookup_min": 2}, "n-gram")
    if args.method in ("draft_model", "both"):
        draft = args.draft
        if draft is None and args.model is None:
            draft = str(build_demo_model("small-draft", ROOT / "models" / "small-draft", if_missing=True))
        if draft is None:
            print("\n== draft model: skipped (no --draft given for --model)")
            return
        run(args, model, {"method": "draft_model", "model": draft, "num_speculative_tokens": args.k},
            "draft model")


if __name__ == "__main__":
    main()

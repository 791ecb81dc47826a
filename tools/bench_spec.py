#!/usr/bin/env python3
"""Speculative decoding on vs off, measured in one run on the same weights and prompts.

Two workloads: input-grounded prompts (chat-templated "repeat / correct / extract the sentences that
mention X", and a code listing to continue as a plain completion: answers a real instruct model writes by
copying its input) and open-ended prompts (a story, an explanation: little to copy). Each at one stream
(prompts one after another) and at 16 streams (all in one batch). Greedy, up to --tokens new tokens, ending
at EOS (--ignore-eos: always --tokens). For each cell: output tok/s off and on, the ratio, the acceptance
figures (accepted / draft tokens, mean accepted length per verify row: load-independent) and whether the
outputs are token-identical (they must be). Each cell first runs once untimed on both engines (kernels
built, the step-cost fit fed); then rounds (--rounds) alternate which engine goes first, each keeps its
best. The load average is printed at the start, after each cell and at the end (the ratios are only as
good as the machine was quiet). First (--verify-cost POS, 0 to skip): the cost of one verify forward of
k + 1 tokens against a 1-token decode step at one stream, wall and CPU time.

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
from mindie_service.engine.step import ScheduledChunk, SchedulerOutput  # noqa: E402

PASSAGE = ("The harbor town of Vell keeps three lighthouses. Mara Quint tends the northern one, Tobias Reed the "
           "eastern one, and the old southern tower has stood empty since the storm of 1911. Every spring the "
           "council votes on whether to restore it, and every spring the vote is tied. Fishing boats still use "
           "the northern light to find the channel, and the ferry from Oslin follows the eastern one.")
TYPOS = ("The harbour town of Vell keeps three lighthouses. Mara Quint tends the northren one, Tobias Reed the "
         "eastern one, and the old southern tower has stood empty since the strom of 1911. Every spring the "
         "council votes on wether to restore it, and every spring the vote is tied.")
REPORT = ("Minutes of the council meeting, 4 March. The meeting opened at seven with eleven members present. "
          "The treasurer reported that the harbor fees rose by four percent last year. Mara Quint asked again "
          "for money to repair the lighthouse lamp, which failed twice in February. The school roof will be "
          "replaced in the summer. Tobias Reed proposed that the southern lighthouse be sold to a private "
          "buyer. The vote on the sale was tied, six to five against with one abstention counted as for. "
          "The meeting closed at nine.")
CODE = '''class Shapes:
    def area_square(self, side: float) -> float:
        """The area of a square with sides ``side``."""
        return side * side

    def area_rectangle(self, width: float, height: float) -> float:
        """The area of a rectangle ``width`` by ``height``."""
        return width * height

    def perimeter_square(self, side: float) -> float:
        """The perimeter of a square with sides ``side``."""
        return 4 * side

    def perimeter_rectangle(self, width: float, height: float) -> float:
'''
# Prompts whose answer repeats their input, as a real instruct model answers them (chat template), and a
# code listing to continue (a plain completion, as an editor sends it).
GROUNDED: list[tuple[str, bool]] = [
    (f"Repeat the following text exactly, word for word:\n\n{PASSAGE}", True),
    (f"Correct the spelling mistakes in the text below and write out the whole corrected text.\n\n{TYPOS}", True),
    (f"Extract the sentences that mention the lighthouse from these minutes. Copy them word for word.\n\n"
     f"{REPORT}", True),
    (CODE, False),
    (f"Rewrite the following text exactly as it is, then add one sentence at its end.\n\n{PASSAGE}", True),
    (f"Add a method volume_cube to this class and print the whole class.\n\n```python\n{CODE}"
     f"        return 2 * (width + height)\n```", True),
    (f"Extract the sentences that mention Mara Quint or Tobias Reed. Copy them exactly.\n\n{REPORT}", True),
    (f"Copy this passage exactly, keeping every name and number:\n\n{PASSAGE}", True),
]
OPEN: list[tuple[str, bool]] = [(t, True) for t in (
    "Write a short story about a lighthouse keeper who finds a letter.",
    "Explain why the sky is blue to a ten-year-old.",
    "Give three ideas for a weekend trip in the mountains.",
    "What makes a good cup of tea? Answer in a paragraph.",
    "Describe a busy market in the morning.",
    "Write a poem about winter rivers.",
    "List some uses of copper and why it is chosen for each.",
    "Tell me about the history of bridges in a few sentences.",
)]


def prompts_for(llm: LLM, texts: list[tuple[str, bool]], n: int) -> list[str]:
    """``n`` prompts cycling over ``texts``; those marked chat rendered with the chat template (when the
    tokenizer has one), the others sent as they are (a completion)."""
    tok = llm.tokenizer
    out = []
    for i in range(n):
        t, chat = texts[i % len(texts)]
        if chat and getattr(tok, "chat_template", None):
            t = tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
        out.append(t)
    return out


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def timed(llm: LLM, prompts: list[str], streams: int, tokens: int, ignore_eos: bool) -> tuple[float, list[list[int]]]:
    """Output tok/s over ``prompts`` run ``streams`` at a time, and the tokens."""
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=ignore_eos)
    spec = llm.engine.spec
    if spec is not None:
        spec.ngram.memory.clear()
    t = time.perf_counter()
    outs: list[list[int]] = []
    for i in range(0, len(prompts), streams):
        outs += [r.outputs[0].token_ids for r in llm.generate(prompts[i:i + streams], params, use_tqdm=False)]
    return sum(map(len, outs)) / (time.perf_counter() - t), outs


def verify_cost(llm: LLM, ks: list[int], pos: int, rounds: int) -> None:
    """The runner's forward (+ greedy argmax) for one sequence at position ``pos``: a plain 1-token decode vs a
    verify chunk of k + 1 tokens, alternating, best of ``rounds``: the ratio cost(k+1)/cost(1) the
    speculation pays per step (one stream; the KV pool's unused blocks stand in for a real context)."""
    eng = llm.engine
    bs = eng.cfg.cache_block_size
    table = tuple(range(1, (pos + max(ks) + 1) // bs + 2))

    def step(n: int) -> tuple[float, float]:
        c = ScheduledChunk(request_id="v", start=pos, token_ids=tuple(range(100, 100 + n)), block_table=table,
                           sample=True, num_draft=n - 1)
        t, cpu = time.perf_counter(), time.process_time()
        eng.runner.execute(SchedulerOutput([c], 1 if n == 1 else 0)).logits.argmax(-1).tolist()
        return time.perf_counter() - t, time.process_time() - cpu

    sizes = [1] + [k + 1 for k in ks]
    best = {n: (float("inf"), float("inf")) for n in sizes}
    for r in range(rounds + 2):  # the first two untimed: kernels built, caches warm
        for n in (sizes if r % 2 else sizes[::-1]):
            wall, cpu = step(n)
            if r >= 2:
                best[n] = (min(best[n][0], wall), min(best[n][1], cpu))
    for i, what in enumerate(("wall", "CPU (all threads; less sensitive to a shared machine)")):
        print(f"verify cost at position {pos}, one stream, best of {rounds}, {what}: "
              f"1 token {best[1][i] * 1e3:.1f} ms; "
              + "; ".join(f"k={k}: {k + 1} tokens {best[k + 1][i] * 1e3:.1f} ms = {best[k + 1][i] / best[1][i]:.2f}x"
                          for k in ks) + f" ({load()})", flush=True)


def counters(llm: LLM) -> tuple[int, int, int]:
    s = llm.engine.stats()
    return s.spec_num_drafts, s.spec_num_draft_tokens, s.spec_num_accepted_tokens


def cell(args: argparse.Namespace, off: LLM, on: LLM, name: str, texts: list[tuple[str, bool]], streams: int) -> None:
    """One workload at one stream count: an untimed run on each engine, then --rounds alternating rounds
    (which engine goes first alternates), each engine's best kept; acceptance counted over the timed rounds."""
    prompts = prompts_for(off, texts, args.prompts_1 if streams == 1 else streams)
    best_off = best_on = 0.0
    same = True
    for llm in (off, on):  # untimed: the kernels of these shapes are built, the step-cost fit fed
        timed(llm, prompts, streams, args.tokens, args.ignore_eos)
    before = counters(on)
    made = 0
    for r in range(args.rounds):
        order = (on, off) if r % 2 else (off, on)
        res = {id(llm): timed(llm, prompts, streams, args.tokens, args.ignore_eos) for llm in order}
        (r_off, t_off), (r_on, t_on) = res[id(off)], res[id(on)]
        best_off, best_on = max(best_off, r_off), max(best_on, r_on)
        same = same and t_off == t_on
        made += sum(map(len, t_on))
    d, dt, acc = (a - b for a, b in zip(counters(on), before))
    print(f"{name:10} {streams:>7} {best_off:>10.1f} {best_on:>10.1f} {best_on / best_off:>6.2f} "
          f"{(acc / dt if dt else 0):>7.2f} {(1 + acc / d if d else 0):>8.2f} {dt / max(1, made):>11.2f} "
          f"{'yes' if same else 'NO':>9}  {load()}", flush=True)


def run(args: argparse.Namespace, model: str, spec_cfg: dict, label: str) -> None:
    # A fixed KV pool (16 streams x 1024 tokens), not one sized from free memory: two engines share the machine.
    common = dict(max_batch_size=32, cache_block_size=16, enable_prefix_caching=False, max_seq_len=2048,
                  num_kv_blocks=1024, max_iter_times=args.tokens)
    off = LLM(model, **common)
    on = LLM(model, **common, speculative_config=spec_cfg)
    if args.verify_cost:
        verify_cost(off, [4, 8], args.verify_cost, max(5, args.rounds * 2))
    print(f"\n== {label}: {spec_cfg}")
    print(f"{'workload':10} {'streams':>7} {'off tok/s':>10} {'on tok/s':>10} {'ratio':>6} {'accept':>7} "
          f"{'mean len':>8} {'drafted/tok':>11} {'identical':>9}", flush=True)
    for name, texts in (("grounded", GROUNDED), ("open", OPEN)):
        for streams in args.streams:
            cell(args, off, on, name, texts, streams)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="checkpoint folder (default: the demo `small` model, built if missing)")
    ap.add_argument("--draft", help="draft checkpoint for --method draft_model (default: demo small-draft)")
    ap.add_argument("--method", choices=("ngram", "draft_model", "both"), default="both")
    ap.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    ap.add_argument("--lookup-min", type=int, default=1, help="n-gram: prompt_lookup_min")
    ap.add_argument("--lookup-max", type=int, default=4, help="n-gram: prompt_lookup_max")
    ap.add_argument("--tokens", type=int, default=128, help="the most new tokens per prompt")
    ap.add_argument("--ignore-eos", action="store_true", help="always make --tokens tokens (default: stop at EOS)")
    ap.add_argument("--prompts-1", type=int, default=8, help="prompts run one after another at one stream")
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--verify-cost", type=int, default=256, metavar="POS",
                    help="first time a verify forward of k+1 tokens against a 1-token step at this position (0: skip)")
    args = ap.parse_args()
    print(f"bench_spec {' '.join(sys.argv[1:])}: start, {load()}", flush=True)
    model = args.model or str(build_demo_model("small", ROOT / "models" / "small", if_missing=True))
    if args.method in ("ngram", "both"):
        run(args, model, {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": args.lookup_max,
                          "prompt_lookup_min": args.lookup_min}, "n-gram")
    if args.method in ("draft_model", "both"):
        draft = args.draft
        if draft is None and args.model is None:
            draft = str(build_demo_model("small-draft", ROOT / "models" / "small-draft", if_missing=True))
        if draft is None:
            print("\n== draft model: skipped (no --draft given for --model)")
        else:
            run(args, model, {"method": "draft_model", "model": draft, "num_speculative_tokens": args.k},
                "draft model")
    print(f"bench_spec: end, {load()}", flush=True)


if __name__ == "__main__":
    main()

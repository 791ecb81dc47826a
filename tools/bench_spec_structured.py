#!/usr/bin/env python3
"""Speculative decoding on vs off for JSON-schema-constrained requests, in one run on the same weights.

Extraction prompts (a passage, then "give its people as JSON"): the answer copies names and words from the
prompt, where n-gram drafts find matches; the grammar forces the keys and punctuation (forced runs on in both
engines). Greedy; one stream (prompts one after another) and all prompts in one batch. Per cell: output tok/s
off and on, the ratio, accepted / draft tokens, draft tokens the grammar cut, verify-row masks filled, and
whether the outputs are token-identical (they must be). A warm-up run on both engines first; then rounds
alternate which engine goes first and each keeps its best. The prefix cache is off and the n-gram memory
cleared before each timed run (a repeated prompt must not draft from its own earlier answer).

    python tools/bench_spec_structured.py                                  # models/SmolLM2-135M-Instruct
    python tools/bench_spec_structured.py --model models/small --rounds 3
    python tools/bench_spec_structured.py --logprobs                       # forced runs off (logprobs asked)
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

PASSAGES = [
    "The harbor town of Vell keeps three lighthouses. Mara Quint tends the northern one, Tobias Reed the eastern "
    "one, and Ilse Varga the southern tower, which has stood since 1911.",
    "At the Orchard Street market, Jonah Pike sells apples, Rosa Delgado sells bread and cheese, and Wen Li "
    "repairs bicycles in the back corner every Saturday.",
    "The expedition had four members: Captain Aldo Ferri, the geologist Nadia Osei, the cook Pim Larsen and the "
    "radio operator Kenji Mori. They left Tromso in March.",
    "Our team meeting on Monday: Priya Nair will draft the budget, Lukas Brandt reviews the contracts, and Sofia "
    "Rossi books the venue in Lisbon.",
]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["people"],
          "properties": {"people": {"type": "array", "maxItems": 4, "items": {
              "type": "object", "additionalProperties": False, "required": ["name", "role"],
              "properties": {"name": {"type": "string", "maxLength": 30},
                             "role": {"type": "string", "maxLength": 40}}}}}}


def prompts_for(llm: LLM, n: int) -> list[str]:
    tok = llm.engine.tokenizer
    out = []
    for i in range(n):
        text = f"{PASSAGES[i % len(PASSAGES)]}\n\nList every person in the text above with their role, as JSON."
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                           add_generation_prompt=True)
        out.append(text)
    return out


def timed(llm: LLM, prompts: list[str], params: SamplingParams, batch: bool) -> tuple[float, list, int]:
    if llm.engine.spec is not None:
        llm.engine.spec.ngram.memory.clear()
    t0 = time.perf_counter()
    if batch:
        res = llm.generate(prompts, params, use_tqdm=False)
    else:
        res = [r for p in prompts for r in llm.generate([p], params, use_tqdm=False)]
    dt = time.perf_counter() - t0
    ids = [r.outputs[0].token_ids for r in res]
    return sum(len(x) for x in ids) / dt, ids, sum(len(x) for x in ids)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct"))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--logprobs", action="store_true", help="requests ask for logprobs (forced runs then off: the "
                    "grammar's forced bytes move only as drafts)")
    args = ap.parse_args()
    common = dict(enable_prefix_caching=False, num_kv_blocks=512, cache_block_size=16)
    spec = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    off, on = LLM(args.model, **common), LLM(args.model, **common, speculative_config=spec)
    prompts = prompts_for(off, args.prompts)
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, structured_outputs={"json": SCHEMA},
                            logprobs=1 if args.logprobs else None)
    print(f"model {args.model}; {len(prompts)} prompts, <= {args.tokens} tokens, JSON schema, ngram k={args.k}, logprobs {args.logprobs}; "
          f"load {os.getloadavg()[0]:.1f}")
    for batch in (False, True):
        for llm in (off, on):  # warm-up (kernels, the step-cost fit)
            timed(llm, prompts[:2], params, batch)
        best = {"off": 0.0, "on": 0.0}
        same, tokens = True, 0
        s0 = on.engine.stats()
        for r in range(args.rounds):
            order = [("off", off), ("on", on)] if r % 2 == 0 else [("on", on), ("off", off)]
            got = {}
            for name, llm in order:
                tps, ids, tokens = timed(llm, prompts, params, batch)
                best[name], got[name] = max(best[name], tps), ids
            same &= got["on"] == got["off"]
        s1 = on.engine.stats()
        drafts = s1.spec_num_draft_tokens - s0.spec_num_draft_tokens
        acc = s1.spec_num_accepted_tokens - s0.spec_num_accepted_tokens
        print(f"{'batch of ' + str(len(prompts)) if batch else 'one stream':>12}: off {best['off']:7.1f} tok/s, "
              f"on {best['on']:7.1f} tok/s, on/off {best['on'] / best['off']:.2f}x; accepted {acc}/{drafts} drafts, "
              f"forced drafts {on.engine.spec.forced_drafts}, grammar cut {on.engine.spec.grammar_cut}, verify masks {on.engine.grammar.stats.draft_masks}, "
              f"forced {on.engine.grammar.stats.forced_tokens}, {tokens} tokens/run; identical: {same}; "
              f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

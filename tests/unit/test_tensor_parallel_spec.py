"""Speculative decoding under tensor parallelism (worldSize 2, gloo on the CPU): the draft model runs on rank 0
(unsharded, its own pool), the verify forward is the normal sharded one, and greedy output is token-identical to
the same two ranks without speculation, on both proposers, over the 16-prompt parity set (logprobs equal too);
a sampled draft model's seeded requests draw the same tokens on every pass."""
from __future__ import annotations

import pytest

from mindie_service import LLM, SamplingParams
from mindie_service.devkit.presets import build_demo_model
from mindie_service.engine.runner.model_runner import ModelRunner
from mindie_service.engine.runner.parallel.launcher import ParallelRunner
from tests.conftest import ROOT
from tests.unit.test_tensor_parallel import KW, parity_prompts

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1,
         "dynamic": False}
REPEAT = ["river mountain city garden river mountain city garden river mountain city",
          "one two three four five one two three four five one two three"]


def _greedy(llm: LLM) -> list[tuple[list[int], list[dict]]]:
    params = SamplingParams(max_tokens=24, temperature=0.0, logprobs=2, ignore_eos=True)
    outs = llm.generate(parity_prompts() + REPEAT, params, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]


@pytest.fixture(scope="module")
def unspeculated(tiny_model):
    llm = LLM(str(tiny_model), world_size=2, **KW)
    try:
        yield _greedy(llm)
    finally:
        llm.shutdown()


def _draft_cfg() -> dict:
    draft = build_demo_model("tiny-draft", ROOT / "models" / "tiny-draft", if_missing=True)
    return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3, "dynamic": False}


@pytest.mark.parametrize("proposer", ["ngram", "draft_model"])
def test_speculation_on_two_ranks_is_token_identical(tiny_model, unspeculated, proposer):
    spec = NGRAM if proposer == "ngram" else _draft_cfg()
    llm = LLM(str(tiny_model), world_size=2, speculative_config=spec, **KW)
    try:
        assert isinstance(llm.engine.runner, ParallelRunner)  # the verify forward runs on both ranks
        if proposer == "draft_model":
            draft = llm.engine.spec.draft
            assert type(draft.runner) is ModelRunner  # rank 0 alone, the whole draft model
            assert draft.runner.model.dims.heads == 4 and llm.engine.model.dims.heads == 2  # tiny: 4 heads, sharded
        got = _greedy(llm)
        st = llm.engine.stats()
        if proposer == "draft_model":  # sampled drafts, rejection-sampled on rank 0: deterministic per seed
            sampled = [SamplingParams(max_tokens=12, temperature=1.0, top_k=20, seed=s, ignore_eos=True)
                       for s in range(8)]
            runs = [[o.outputs[0].token_ids for o in llm.generate(REPEAT * 4, sampled, use_tqdm=False)]
                    for _ in range(2)]
            assert runs[0] == runs[1] and llm.engine.stats().spec_num_accepted_tokens > st.spec_num_accepted_tokens
    finally:
        llm.shutdown()
    assert st.spec_num_draft_tokens > st.spec_num_accepted_tokens > 0
    assert [t for t, _ in got] == [t for t, _ in unspeculated]
    for (_, lp), (_, want) in zip(got, unspeculated):
        for p, q in zip(lp, want):
            assert p.keys() == q.keys() and all(abs(p[t] - q[t]) < 1e-3 for t in p)

"""Sampled output keeps the target's distribution with speculation on: 2,000 seeded samples of the first
tokens of a fixed prompt, speculated, against 2,000 unspeculated ones with other seeds, chi-square homogeneity
of each position's token counts at 0.1%. Both proposers: n-gram (one-hot drafts, draw and compare) and a
sampled draft model (models/tiny-draft's drafts drawn from its own distribution, rejection-sampled against the
target's: engine.sample.spec_accept). Small blocks: the shared prompt is a prefix-cache hit, so prefills cost little."""
from __future__ import annotations

from collections import Counter

import pytest
from scipy.stats import chi2_contingency

from mindie_service import LLM, SamplingParams
from mindie_service.devkit.presets import build_demo_model
from tests.conftest import ROOT

SAMPLES = 2000
TOKENS = 4  # token 0 comes from the prefill; tokens 1..3 from verify rows
REPEAT = "river mountain city garden river mountain city garden river mountain city"
POOL = dict(num_kv_blocks=3000, cache_block_size=4, max_batch_size=256)
NGRAM_FIXED = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1,
               "dynamic": False}


def _sampled(llm: LLM, seeds: range) -> list[tuple[int, ...]]:
    params = [SamplingParams(max_tokens=TOKENS, temperature=1.0, top_k=20, seed=s, ignore_eos=True) for s in seeds]
    return [tuple(r.outputs[0].token_ids) for r in llm.generate([REPEAT] * len(params), params, use_tqdm=False)]


@pytest.fixture(scope="module")
def reference(tiny_model) -> list[tuple[int, ...]]:
    return _sampled(LLM(str(tiny_model), **POOL), range(10_000, 10_000 + SAMPLES))


def _homogeneous(spec: list[tuple[int, ...]], ref: list[tuple[int, ...]]) -> None:
    for pos in range(1, TOKENS):
        a, b = Counter(s[pos] for s in spec), Counter(s[pos] for s in ref)
        common = [t for t in set(a) | set(b) if a[t] + b[t] >= 20]
        rest = [sum(c[t] for t in c if t not in common) for c in (a, b)]
        table = [[a[t] for t in common] + [rest[0]], [b[t] for t in common] + [rest[1]]]
        assert chi2_contingency(table)[1] > 0.001, (pos, table)


def test_ngram_drafts_keep_the_target_distribution(tiny_model, reference):
    llm = LLM(str(tiny_model), **POOL, speculative_config=NGRAM_FIXED)
    _sampled(llm, range(20_000, 20_100))  # n-gram memory: other samples' text drafts for these
    spec = _sampled(llm, range(SAMPLES))
    st = llm.engine.stats()
    assert st.spec_num_accepted_tokens > 100 and st.spec_num_draft_tokens > st.spec_num_accepted_tokens
    _homogeneous(spec, reference)


def test_sampled_draft_model_keeps_the_target_distribution(tiny_model, reference):
    draft = build_demo_model("tiny-draft", ROOT / "models" / "tiny-draft", if_missing=True)
    llm = LLM(str(tiny_model), **POOL, speculative_config={"method": "draft_model", "model": str(draft),
                                                           "num_speculative_tokens": 3, "dynamic": False})
    proposer, verified = llm.engine.spec.draft, []
    dists_for = proposer.dists_for

    def counting(rid, drafts):  # the verify rows really rejection-sample against the draft's q
        q = dists_for(rid, drafts)
        verified.append(q is not None)
        return q
    proposer.dists_for = counting
    spec = _sampled(llm, range(SAMPLES))
    st = llm.engine.stats()
    assert sum(verified) > SAMPLES // 2
    assert st.spec_num_accepted_tokens > 100 and st.spec_num_draft_tokens > st.spec_num_accepted_tokens
    _homogeneous(spec, reference)

"""Speculative decoding through the offline API is exact: greedy output token-identical (and logprobs equal) with
speculation on and off, on both proposers, with EOS, stop strings and output caps inside accepted runs, with a
LoRA adapter and with preemption forced by a small KV pool; seeded sampling draws what it would without
speculation (n-gram) or deterministically per seed (a sampled draft model; the chi-square of the sampled
distribution is tests/unit/test_spec_distribution.py); rejected drafts never reach the prefix cache."""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mindie_service import LLM, SamplingParams
from mindie_service.devkit.lora import build_demo_lora
from mindie_service.devkit.presets import build_demo_model
from mindie_service.engine.contract import FINISH_EOS, FINISH_LENGTH, FINISH_STOP
from tests.conftest import ROOT
from tests.prompts import parity_prompts

POOL = dict(num_kv_blocks=400, cache_block_size=16)
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
# dynamic False: always draft k tokens, so every test exercises verify chunks however the step times fall.
NGRAM_FIXED = {**NGRAM, "dynamic": False}


@pytest.fixture(scope="module")
def tiny_draft() -> str:
    return str(build_demo_model("tiny-draft", ROOT / "models" / "tiny-draft", if_missing=True))


def _draft_cfg(path: str) -> dict:
    return {"method": "draft_model", "model": path, "num_speculative_tokens": 3, "dynamic": False}


def _params() -> list[SamplingParams]:
    """Caps from 6 to 36 tokens, logprobs on some rows."""
    return [SamplingParams(max_tokens=6 + (i * 7) % 31, temperature=0.0, ignore_eos=True,
                           logprobs=2 if i % 3 == 0 else None) for i in range(16)]


def _ids(res) -> list[list[int]]:
    return [r.outputs[0].token_ids for r in res]


def _same(a, b) -> None:
    assert _ids(a) == _ids(b)
    for x, y in zip(a, b):
        assert x.outputs[0].text == y.outputs[0].text and x.outputs[0].finish_reason == y.outputs[0].finish_reason
        if x.outputs[0].logprobs is not None:
            for p, q in zip(x.outputs[0].logprobs, y.outputs[0].logprobs):
                assert p.keys() == q.keys() and all(abs(p[t] - q[t]) < 1e-3 for t in p)


@pytest.fixture(scope="module")
def baseline(tiny_model):
    llm = LLM(str(tiny_model), **POOL)
    return llm, llm.generate(parity_prompts(), _params(), use_tqdm=False)


def test_greedy_ngram_is_token_identical(tiny_model, baseline):
    llm = LLM(str(tiny_model), **POOL, speculative_config=NGRAM_FIXED)
    for _ in range(2):  # the second pass drafts from the first's text (memory): long accepted runs
        _same(baseline[1], llm.generate(parity_prompts(), _params(), use_tqdm=False))
    st = llm.engine.stats()
    assert 0 < st.spec_num_accepted_tokens < st.spec_num_draft_tokens  # runs accepted and drafts rejected
    assert st.spec_mean_accepted_length > 1.5


def test_greedy_draft_model_is_token_identical(tiny_model, tiny_draft, baseline):
    llm = LLM(str(tiny_model), **POOL, speculative_config=_draft_cfg(tiny_draft))
    _same(baseline[1], llm.generate(parity_prompts(), _params(), use_tqdm=False))
    st = llm.engine.stats()
    assert 0 < st.spec_num_accepted_tokens < st.spec_num_draft_tokens


def test_eos_stop_and_cap_cut_accepted_runs(tiny_eos_model):
    """tiny-eos ends on EOS; stop strings are taken from the middle of the unspeculated text."""
    plain = LLM(str(tiny_eos_model), **POOL)
    first = plain.generate(parity_prompts(), SamplingParams(max_tokens=30, temperature=0.0), use_tqdm=False)
    texts = [r.outputs[0].text for r in first]
    params = [SamplingParams(max_tokens=30 - i, temperature=0.0, stop=[t[len(t) // 2:len(t) // 2 + 3]]
                             if i % 2 and len(t) > 8 else None) for i, t in enumerate(texts)]
    ref = plain.generate(parity_prompts(), params, use_tqdm=False)
    llm = LLM(str(tiny_eos_model), **POOL, speculative_config=NGRAM_FIXED)
    for _ in range(2):
        _same(ref, llm.generate(parity_prompts(), params, use_tqdm=False))
    reasons = Counter(r.outputs[0].finish_reason for r in ref)
    assert reasons[FINISH_EOS] and reasons[FINISH_STOP] and reasons[FINISH_LENGTH]
    assert llm.engine.stats().spec_num_accepted_tokens > 0


@pytest.mark.parametrize("proposer,swap", [("ngram", 0), ("ngram", 1), ("draft_model", 0)])
def test_preemption_in_a_small_pool(tiny_model, tiny_draft, baseline, proposer, swap):
    """Preempted rows are recomputed (swap 0) or swapped out to the host pool and back (swap 1 GB)."""
    spec = NGRAM_FIXED if proposer == "ngram" else _draft_cfg(tiny_draft)
    llm = LLM(str(tiny_model), num_kv_blocks=24, cache_block_size=16, swap_space_gb=swap, speculative_config=spec)
    for _ in range(2 if proposer == "ngram" else 1):
        _same(baseline[1], llm.generate(parity_prompts(), _params(), use_tqdm=False))
    st = llm.engine.stats()
    assert st.num_preemptions > 0 and st.spec_num_accepted_tokens > 0
    assert (llm.engine.scheduler.num_swap_outs > 0) == (swap > 0)


def test_lora_adapter_verifies_under_the_adapter(tiny_model, tmp_path_factory):
    path = str(build_demo_lora(str(tiny_model), str(tmp_path_factory.mktemp("lora") / "a"), rank=8, seed=3))
    mods = ({"name": "a", "path": path},)
    from mindie_service.engine.configs.engine_config import LoraModuleSpec
    loras = tuple(LoraModuleSpec(m["name"], m["path"]) for m in mods)
    prompts, params = parity_prompts()[:8], _params()[:8]
    ref = LLM(str(tiny_model), **POOL, lora_modules=loras).generate(prompts, params, use_tqdm=False, adapter_id="a")
    base = LLM(str(tiny_model), **POOL).generate(prompts, params, use_tqdm=False)
    assert _ids(ref) != _ids(base)  # the adapter changes the output
    llm = LLM(str(tiny_model), **POOL, lora_modules=loras, speculative_config=NGRAM_FIXED)
    for _ in range(2):
        _same(ref, llm.generate(prompts, params, use_tqdm=False, adapter_id="a"))
    assert llm.engine.stats().spec_num_accepted_tokens > 0


def _sampled(llm: LLM, prompt: str, seeds: range, n: int = 4) -> list[tuple[int, ...]]:
    params = [SamplingParams(max_tokens=n, temperature=1.0, top_k=20, seed=s, ignore_eos=True) for s in seeds]
    return [tuple(r.outputs[0].token_ids) for r in llm.generate([prompt] * len(params), params, use_tqdm=False)]


REPEAT = "river mountain city garden river mountain city garden river mountain city"


def test_seeded_sampling_draws_as_without_speculation(tiny_model, tiny_draft, baseline):
    """n-gram (one-hot drafts): same seeds, same tokens as without speculation (the second pass drafts from the
    first's text, held in its memory). A sampled draft model rejection-samples (engine.sample.spec_accept), which
    draws other tokens from the same distribution (tests/unit/test_spec_distribution.py), and is deterministic
    per seed: the same tokens on every pass and in a fresh engine."""
    ref = _sampled(baseline[0], REPEAT, range(40))
    llm = LLM(str(tiny_model), **POOL, speculative_config=NGRAM_FIXED)
    for _ in range(2):
        assert _sampled(llm, REPEAT, range(40)) == ref
    assert llm.engine.stats().spec_num_accepted_tokens > 0
    llm = LLM(str(tiny_model), **POOL, speculative_config=_draft_cfg(tiny_draft))
    first = _sampled(llm, REPEAT, range(40))
    assert _sampled(llm, REPEAT, range(40)) == first
    assert llm.engine.stats().spec_num_accepted_tokens > 0 and first != ref
    fresh = LLM(str(tiny_model), **POOL, speculative_config=_draft_cfg(tiny_draft))
    assert _sampled(fresh, REPEAT, range(20, 40)) == first[20:]  # whatever else is in the batch


def test_rejected_drafts_never_enter_the_prefix_cache(tiny_model, tiny_draft):
    """Blocks cached during speculation (with rejections) are reused by later prompts: their K/V must be the
    accepted tokens', so the later prompts' output equals a cold engine's."""
    llm = LLM(str(tiny_model), num_kv_blocks=400, cache_block_size=4, speculative_config=_draft_cfg(tiny_draft))
    prompts = parity_prompts()
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    first = llm.generate(prompts, params, use_tqdm=False)
    st = llm.engine.stats()
    assert st.spec_num_draft_tokens > st.spec_num_accepted_tokens > 0
    follow = [r.prompt_token_ids + r.outputs[0].token_ids for r in first]
    spec, llm.engine.spec = llm.engine.spec, None  # reuse the cached blocks without speculating
    hits = llm.engine.blocks.prefix_hits
    warm = llm.generate(follow, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=1),
                        use_tqdm=False)
    assert llm.engine.blocks.prefix_hits - hits == len(follow)
    cold = LLM(str(tiny_model), num_kv_blocks=400, cache_block_size=4, enable_prefix_caching=False)
    _same(cold.generate(follow, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=1),
                        use_tqdm=False), warm)
    llm.engine.spec = spec


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.booleans(), min_size=48, max_size=48), k=st.integers(1, 6))
def test_any_pattern_of_accepted_and_rejected_drafts_is_exact(tiny_model, baseline, flips, k):
    """An oracle proposer drafts the unspeculated continuation with tokens flipped where hypothesis says: every
    pattern of accepted runs and rejections gives the unspeculated output."""
    llm = _oracle_llm(str(tiny_model))
    prompts, params = parity_prompts()[12:], _params()[12:]
    ref = {tuple(r.prompt_token_ids): r.prompt_token_ids + r.outputs[0].token_ids for r in baseline[1][12:]}

    def propose(tokens, index, kk, cache_key):
        full = next(v for p, v in ref.items() if tokens[:len(p)] == list(p))
        n = len(tokens)
        return [t if not flips[(n + i) % len(flips)] else (t + 1) % 2048 for i, t in enumerate(full[n:n + k])]

    llm.engine.spec.ngram.propose = propose
    _same(baseline[1][12:], llm.generate(prompts, params, use_tqdm=False))


_ORACLE: dict[str, LLM] = {}


def _oracle_llm(model: str) -> LLM:
    if model not in _ORACLE:
        _ORACLE[model] = LLM(model, **POOL, speculative_config={**NGRAM_FIXED, "num_speculative_tokens": 6,
                                                                 "memory": False})
    return _ORACLE[model]

"""The pieces of speculative decoding on their own: config shapes (unknown keys refused, MindIE's gamma rule),
the n-gram index against a brute-force reference (hypothesis), the accepted run, the scheduler's draft budget
and rollback (torch-free, hand-made verify results), and the step-cost rule that turns speculation off."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.sched.scheduler import Scheduler
from mindie_service.engine.sequence import Sequence
from mindie_service.engine.configs.spec_config import SpeculativeConfig
from mindie_service.engine.spec.spec_ngram import DRAFTS_PER_MATCHED, NgramIndex, NgramProposer
from mindie_service.engine.spec.spec_policy import SeqSpec, StepCostModel, depth, probe_interval
from mindie_service.engine.spec.speculator import accepted_run
from mindie_service.engine.step import ScheduledChunk, SchedulerOutput
from mindie_service.errors import ValidationError
from mindie_service.sampling_params import SamplingParams


# ------------------------------------------------------------------ config
def test_vllm_shape_and_unknown_keys():
    cfg = SpeculativeConfig.from_vllm({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3,
                                       "prompt_lookup_min": 2})
    assert (cfg.method, cfg.num_speculative_tokens, cfg.prompt_lookup_max, cfg.prompt_lookup_min) == ("ngram", 5, 3, 2)
    with pytest.raises(ValidationError, match=r"unknown key\(s\) \['num_spec_tokens'\].*refused rather than ignored"):
        SpeculativeConfig.from_vllm({"method": "ngram", "num_spec_tokens": 4})
    with pytest.raises(ValidationError, match="speculative_config.model"):
        SpeculativeConfig.from_vllm({"method": "draft_model", "num_speculative_tokens": 4})
    with pytest.raises(ValidationError, match="prompt_lookup_max"):
        SpeculativeConfig.from_vllm({"method": "ngram", "prompt_lookup_max": 1, "prompt_lookup_min": 3})
    with pytest.raises(ValidationError, match="unknown key"):
        EngineConfig(model="m", speculative_config={"method": "ngram", "bogus": 1})


def test_mindie_plugin_params():
    cfg = SpeculativeConfig.from_plugin_params(
        '{"plugin_type":"memory_decoding","decoding_length":16,"dynamic_algo":true}', 16)
    assert (cfg.method, cfg.num_speculative_tokens, cfg.dynamic, cfg.memory) == ("ngram", 16, True, True)
    assert SpeculativeConfig.from_plugin_params("", None) is None
    with pytest.raises(ValidationError, match=r"speculationGamma must be >= plugin_params.decoding_length \(16\)"):
        SpeculativeConfig.from_plugin_params('{"plugin_type":"memory_decoding","decoding_length":16}', 8)
    with pytest.raises(ValidationError, match="lookahead"):
        SpeculativeConfig.from_plugin_params('{"plugin_type":"la","level":4}', None)
    with pytest.raises(ValidationError, match="JSON-encoded"):
        SpeculativeConfig.from_plugin_params("{plugin_type: x}", None)
    with pytest.raises(ValidationError, match="plugin_params.decoding_length must be an integer in"):
        SpeculativeConfig.from_plugin_params('{"plugin_type":"memory_decoding","decoding_length":17}', None)


# ------------------------------------------------------------------ n-gram proposer
def _reference(tokens: list[int], lo: int, hi: int, k: int) -> list[int]:
    """The longest suffix (hi down to lo tokens) found earlier, its latest occurrence: what follows it."""
    n = len(tokens)
    for m in range(min(hi, n - 1), lo - 1, -1):
        suffix = tokens[n - m:]
        for end in range(n - 1, m - 1, -1):
            if tokens[end - m:end] == suffix:
                return tokens[end:end + min(k, DRAFTS_PER_MATCHED * m)]
    return []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=40), st.integers(1, 3), st.integers(0, 3),
       st.integers(1, 6))
def test_ngram_matches_brute_force(tokens, lo, extra, k):
    hi = lo + extra
    prop = NgramProposer(lo, hi, memory=False)
    idx = NgramIndex(lo, hi)
    for n in range(1, len(tokens)):  # incremental, as a sequence grows
        prop.propose(tokens[:n], idx, k, b"")
    assert prop.propose(tokens, idx, k, b"") == _reference(tokens, lo, hi, k)


def test_draft_length_follows_the_match_length():
    prop = NgramProposer(1, 4, memory=False)
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]
    assert prop.propose(text + [9], NgramIndex(1, 4), 16, b"") == [10, 11, 12]  # one token matched: 3
    assert prop.propose(text + [2, 3, 4], NgramIndex(1, 4), 16, b"") == text[4:13]  # three: 9
    assert prop.propose(text + [2, 3, 4], NgramIndex(1, 4), 5, b"") == text[4:9]  # k still bounds it


def test_memory_drafts_from_finished_text_of_the_same_cache_key():
    prop = NgramProposer(1, 3, memory=True)
    prop.remember([9, 1, 2, 3, 4, 5, 6], b"a")
    assert prop.propose([7, 8, 2, 3], NgramIndex(1, 3), 3, b"a") == [4, 5, 6]
    assert prop.propose([7, 8, 2, 3], NgramIndex(1, 3), 3, b"other adapter") == []


# ------------------------------------------------------------------ acceptance
@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=6), st.lists(st.integers(0, 3), min_size=7, max_size=7))
def test_accepted_run_is_what_one_token_at_a_time_would_emit(drafts, target):
    """``target[j]``: the target's token at verify row j. Decoding one token at a time emits target[0]; it
    then continues from target[0], which the next row assumed only if target[0] equals the draft."""
    chunk = ScheduledChunk("r", 10, (5, *drafts), (0,), True, num_draft=len(drafts))
    run = accepted_run(chunk, target[:len(drafts) + 1])
    expect = [target[0]]
    for j, d in enumerate(drafts):
        if target[j] != d:
            break
        expect.append(target[j + 1])
    assert run == expect and 1 <= len(run) <= len(drafts) + 1


# ------------------------------------------------------------------ scheduler: budget and rollback
def _running(prompt: int = 6, block: int = 4, blocks: int = 32, cache: bool = True):
    cfg = EngineConfig(model="m", cache_block_size=block, max_prefill_tokens=64, max_preempt_count=4)
    bm = BlockManager(blocks, block, cache)
    s = Scheduler(cfg, bm)
    seq = Sequence("a", list(range(100, 100 + prompt)), SamplingParams(max_tokens=50), 50, 0)
    s.add(seq)
    out = s.schedule()
    s.update(out, {"a": 7}, {})  # prompt computed, first token sampled
    return s, bm, seq


def test_verify_chunk_budget_rollback_and_cache():
    s, bm, seq = _running()
    seq.draft_token_ids = [1, 2, 3, 4, 5]
    out = s.schedule()
    (c,) = out.chunks
    assert c.num_draft == 5 and c.token_ids == (7, 1, 2, 3, 4, 5) and c.start == 6 and out.num_decodes == 0
    assert len(seq.block_table) == 3  # positions 6..11: blocks 1 and 2
    s.update(out, {"a": [1, 2, 9]}, {})  # drafts 1, 2 accepted, then the target's own 9
    assert seq.output_token_ids == [7, 1, 2, 9]
    assert seq.num_computed_tokens == 9  # 7, 1, 2 at positions 6..8; 9 not computed yet
    assert len(seq.block_table) == 3  # position 9 is in block 2: nothing to trim yet
    assert seq.num_registered_blocks == 2  # blocks 0..1 full and computed; block 2 holds a rejected slot
    out = s.schedule()  # no drafts: a plain decode at position 9
    assert out.num_decodes == 1 and out.chunks[0].start == 9


def test_rejected_tail_blocks_are_trimmed_and_never_cached():
    s, bm, seq = _running(prompt=3)
    seq.draft_token_ids = list(range(1, 10))  # positions 3..12: blocks 0..3
    out = s.schedule()
    assert out.chunks[0].num_draft == 9 and len(seq.block_table) == 4
    tail = seq.block_table[2:]
    s.update(out, {"a": [5]}, {})  # the first draft rejected
    assert seq.num_computed_tokens == 4 and len(seq.block_table) == 2
    assert all(bm.ref_counts[b] == 0 and bm.block_hash[b] is None for b in tail)
    assert all(b not in bm.cached.values() for b in tail)


def test_drafts_respect_budget_output_cap_and_free_blocks():
    s, bm, seq = _running(blocks=3)  # 12 slots; prompt 6 + 1 output: one block left for drafts
    seq.draft_token_ids = [1] * 10
    out = s.schedule()
    assert out.chunks[0].num_draft == 5  # positions 6..11 fit the three blocks
    s.update(out, {"a": [1]}, {})
    seq.max_output = 3  # two outputs so far: room for one more token, so no draft
    seq.draft_token_ids = [1, 2]
    out = s.schedule()
    assert out.chunks[0].num_draft == 0 and out.num_decodes == 1


def test_preempted_rows_lose_their_drafts():
    s, bm, seq = _running()
    seq.draft_token_ids = [1, 2]
    s._preempt(seq, SchedulerOutput())
    assert seq.draft_token_ids == [] and seq.block_table == []


# ------------------------------------------------------------------ adaptivity
def _feed(m: StepCostModel, rows: int, sizes: range, a: float, b: float) -> None:
    """Decode steps of ``rows`` rows with ``sizes`` tokens (rows + drafts) costing ``a + b*T``."""
    for t in sizes:
        m.expect(rows, t)
        m.observe(t, a + b * t)


def test_step_cost_rule_turns_speculation_off_for_large_batches():
    m = StepCostModel()
    _feed(m, 1, range(1, 10), 0.020, 0.001)  # a = 20 ms to read the weights, b = 1 ms per token
    _feed(m, 256, range(256, 2000, 37), 0.020, 0.001)
    assert m.cost(1) < 0.1 and m.cost(256) > 0.9
    good = SeqSpec(accepted=40, tried=44)
    assert depth(good, 8, m.cost(1), True) >= 4
    assert depth(good, 8, m.cost(256), True) == 0
    bad = SeqSpec(accepted=0, tried=40)
    assert depth(bad, 8, m.cost(1), True) == 0
    assert depth(bad, 8, m.cost(1), False) == 8  # dynamic off: always k


def test_step_costs_are_fitted_per_batch_size_class():
    """One stream is bandwidth-bound (drafts nearly free), 16 streams compute-bound (each token costs): one
    line over both would price a one-stream draft with the big batch's slope."""
    m = StepCostModel()
    _feed(m, 1, range(1, 10), 0.030, 0.0005)
    _feed(m, 16, range(16, 145, 8), 0.010, 0.004)
    assert m.cost(1) == pytest.approx(0.0005 / 0.0305)
    assert m.cost(16) == pytest.approx(0.064 / 0.074)
    assert m.fit(20) == m.fit(16) and m.cost(40) == 0.05  # same class; a class never measured: the prior
    good = SeqSpec(accepted=40, tried=44)
    assert depth(good, 8, m.cost(1), True) == 8 and depth(good, 8, m.cost(16), True) == 1


def test_steps_with_prompt_tokens_are_not_fitted():
    m = StepCostModel()
    _feed(m, 1, range(1, 10), 0.030, 0.0005)
    m.expect(1, 9)
    m.observe(300, 5.0)  # a new request's prompt joined the step: not a decode step's cost
    m.observe(5, 9.0)  # not announced by expect: not fitted either
    assert m.cost(1) == pytest.approx(0.0005 / 0.0305)


def test_the_last_fit_is_kept_once_drafting_stops():
    """Speculation off for a class means its steps stop varying in size: the fit measured while they varied
    keeps deciding (the optimistic prior would turn speculation back on every few steps)."""
    m = StepCostModel()
    _feed(m, 16, range(16, 145, 8), 0.010, 0.004)
    c = m.cost(16)
    for _ in range(500):
        m.expect(16, 16)
        m.observe(16, 0.074)
    assert m.cost(16) == pytest.approx(c)


def test_a_row_that_stops_drafting_probes_again():
    bad = SeqSpec(accepted=0, tried=40)
    ks = [depth(bad, 4, 0.05, True) for _ in range(40)]
    assert 0 < sum(ks) <= 3


def test_probes_come_rarer_where_drafts_cost_more():
    assert probe_interval(0.05) == 17 and probe_interval(0.75) == 64
    bad = SeqSpec(accepted=0, tried=40)
    cheap = sum(depth(bad, 4, 0.05, True) for _ in range(640))
    dear = sum(depth(bad, 4, 0.75, True) for _ in range(640))
    assert cheap == 37 and dear == 10

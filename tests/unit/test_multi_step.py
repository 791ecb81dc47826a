"""Multi-step decode (engine.sched.bursts): a few plain greedy decodes run several steps a call. The tokens,
log-probabilities, texts and finishes are the ones single steps give (bursts cut at EOS, a stop string and
max_tokens), no slot is left behind, and anything else runs one step a call."""
from __future__ import annotations

from typing import Any

import pytest

from mindie_service import LLM, SamplingParams
from mindie_service.engine.contract import EngineRequest
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.sched.bursts import BURST_BUDGET_S, BurstPacer
from mindie_service.errors import ConfigError, MindieError
from mindie_service.models import fused_layers
from tests.unit.test_config import load, sched, shipped

PROMPTS = [[5, 17, 3, 99, 42], [7, 7, 8], [101, 33, 2, 64, 11, 9, 250, 4], [12]]
EOS_PROMPTS = [[303, 325, 174, 100, 127], [364, 115], [102, 97], [136, 186, 377]]  # tiny-eos: EOS after 29, 9, 19, 7


class StepClock:
    """The engine's step clock, moved only by the runner's made-up step time: the pacer's decisions are the same on
    any machine, however busy (with the real clock a loaded machine's slow steps ran no bursts)."""

    def __init__(self, per_step: float) -> None:
        self.t, self.per_step = 0.0, per_step

    def __call__(self) -> float:
        return self.t


def _llm(model: Any, steps: int, per_step: float = 0.0) -> LLM:
    """An engine whose steps each take ``per_step`` seconds on its step clock (0: bursts always fit)."""
    llm = LLM(str(model), cache_block_size=4, num_kv_blocks=96, decode_steps=steps)
    clock = StepClock(per_step)
    execute = llm.engine.runner.execute

    def timed(out: Any) -> Any:
        clock.t += per_step * (out.chunks[0].steps if out.chunks else 1)
        return execute(out)

    llm.engine.step_clock, llm.engine.runner.execute = clock, timed
    return llm


def _generate(llm: LLM, params: list[SamplingParams], prompts: list[list[int]] = PROMPTS,
              stagger: bool = False) -> tuple[dict[str, list[tuple]], list[int]]:
    """Every request's (token id, logprob, text delta, finish reason) events, and each runner call's steps."""
    steps: list[int] = []
    eng = llm.engine
    execute = eng.runner.execute

    def spy(out: Any) -> Any:
        steps.append(out.chunks[0].steps if out.chunks else 0)
        return execute(out)

    eng.runner.execute = spy
    got: dict[str, list[tuple]] = {}
    pending = [(f"r{i}", p, sp) for i, (p, sp) in enumerate(zip(prompts, params))]
    while pending or eng.has_work():
        if pending and (not stagger or not eng.has_work() or len(steps) % 5 == 0):
            rid, p, sp = pending.pop(0)
            eng.add_request(EngineRequest(rid, tuple(p), sp))
        for ev in eng.step():
            got.setdefault(ev.request_id, []).append((ev.token.id, ev.token.logprob, ev.text_delta, ev.finish_reason))
    eng.runner.execute = execute
    return got, steps


@pytest.mark.parametrize("fused", [True, False], ids=["one-C-call", "forward-a-step"])
def test_bursts_give_what_single_steps_give(tiny_eos_model, fused):
    """EOS, a stop string and max_tokens that are no multiple of the burst end requests inside bursts."""
    params = [SamplingParams(max_tokens=n, temperature=0.0) for n in (23, 9, 30)]
    params.append(SamplingParams(max_tokens=17, temperature=0.0, ignore_eos=True))
    fused_layers.set_enabled(fused)
    try:
        want, one = _generate(_llm(tiny_eos_model, 1), params, EOS_PROMPTS)
        llm = _llm(tiny_eos_model, 4)
        free = llm.engine.blocks.num_free_blocks
        got, burst = _generate(llm, params, EOS_PROMPTS)
        text = "".join(e[2] for e in want["r0"])
        stop = text[len(text) // 2:][:3]
        if stop.strip():  # a stop string found inside the text: the burst that reaches it is cut there
            sp = [SamplingParams(max_tokens=23, temperature=0.0, stop=[stop])]
            assert (_generate(_llm(tiny_eos_model, 4), sp, EOS_PROMPTS[:1])[0]
                    == _generate(_llm(tiny_eos_model, 1), sp, EOS_PROMPTS[:1])[0])
    finally:
        fused_layers.set_enabled(True)
    assert got == want
    assert set(one) == {1} and 4 in burst and len(burst) < len(one)
    assert [len(want[f"r{i}"]) for i in range(4)] == [23, 9, 19, 17]
    assert [want[f"r{i}"][-1][3] for i in range(4)] == ["length", "eos_token", "eos_token", "length"]
    assert llm.engine.blocks.num_free_blocks == free  # slots past a cut burst are given back


def test_staggered_arrivals_and_more_than_four_rows(tiny_model):
    """A request arriving mid-run joins at its prefill step (no burst beside a waiting request); five rows run
    one step a call."""
    params = [SamplingParams(max_tokens=12 + 8 * i, temperature=0.0, ignore_eos=True) for i in range(5)]
    prompts = PROMPTS + [[1, 2, 3]]
    want, _ = _generate(_llm(tiny_model, 1), params, prompts, stagger=True)
    got, steps = _generate(_llm(tiny_model, 4), params, prompts, stagger=True)
    assert got == want and 4 in steps
    together, steps5 = _generate(_llm(tiny_model, 4), params, prompts)
    assert together == want
    assert steps5[:12] == [1] * 12 and 4 in steps5  # five rows until the first ends at 12 tokens, then bursts


@pytest.mark.parametrize("params", [dict(temperature=0.7, seed=3), dict(temperature=0.0, logprobs=2),
                                    dict(temperature=0.0, repetition_penalty=1.2),
                                    dict(temperature=0.0, logit_bias={5: 2.0})],
                         ids=["sampled", "top-logprobs", "penalty", "bias"])
def test_rows_that_ask_more_than_the_argmax_run_one_step_a_call(tiny_model, params):
    sp = [SamplingParams(max_tokens=10, **params)]
    want, _ = _generate(_llm(tiny_model, 1), sp)
    got, steps = _generate(_llm(tiny_model, 4), sp)
    assert got == want and set(steps) == {1}


def test_decode_steps_reaches_the_engine_and_bad_values_are_refused(tmp_path):
    doc = shipped()
    assert load(tmp_path, doc).engine_config().decode_steps == 8
    sched(doc).update(decodeSteps=1)
    assert load(tmp_path, doc).engine_config().decode_steps == 1
    sched(doc).update(decodeSteps=0)
    with pytest.raises(ConfigError, match="decodeSteps"):
        load(tmp_path, doc)
    with pytest.raises(MindieError, match="decode_steps"):
        EngineConfig(model="x", decode_steps=65).validate()


def test_bursts_are_paced_by_the_measured_step_time(tiny_model):
    """A burst stays within BURST_BUDGET_S: as many steps as the measured step time fits in it (so a request
    arriving meanwhile waits no longer), one a call when a step takes more than half of it, and bursts grow back
    once the steps are fast again. The engine's step clock is driven by the test: the same on any machine."""
    pacer = BurstPacer(8)
    assert pacer.observe(0.5, 1) == 1  # a first step that built the tables
    assert [pacer.observe(0.004, 1) for _ in range(2)] == [1, 8]  # outvoted by the next two
    assert pacer.observe(0.004 * 8, 8) == 8 and pacer.observe(0.030, 1) == 8  # one slow step among fast ones
    assert [pacer.observe(0.012, 1) for _ in range(3)] == [8, 3, 3]  # 12 ms steps: 3 fit in 40 ms
    assert [pacer.observe(0.030, 1) for _ in range(3)] == [3, 3, 1]  # slow steps take over
    assert [pacer.observe(0.002, 1) for _ in range(3)] == [1, 1, 8]
    single = _generate(_llm(tiny_model, 1), _PLAIN)[0]
    for per_step, burst in ((0.9 * BURST_BUDGET_S, 1), (0.35 * BURST_BUDGET_S, 2), (0.3 * BURST_BUDGET_S, 3),
                            (0.004, 8), (0.0, 8)):
        got, calls = _generate(_llm(tiny_model, 8, per_step), _PLAIN)
        assert got == single
        # the prefill, then a first decode step alone (nothing measured yet), then bursts up to the cap of 14
        assert calls[:2] == [1, 1] and max(calls) == burst and set(calls[2:-1]) == {burst}, (per_step, calls)
        assert sum(calls) == 14


_PLAIN = [SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)]

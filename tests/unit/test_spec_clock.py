"""The speculation policy (engine.spec.spec_policy) decides from step times measured on the engine's step clock
(LLMEngine.step_clock), never from the machine's own speed: driven by a clock on which a step costs what the
test says, dynamic n-gram speculation drafts all it may where drafts are nearly free, and nothing where each
token costs about a whole step (the first pass's steps, drafted under the prior, are what the fit measured)."""
from __future__ import annotations

from typing import Any, Callable

import pytest

from mindie_service import LLM, SamplingParams
from mindie_service.engine.configs.spec_config import SpeculativeConfig
from mindie_service.engine.sequence import Sequence
from mindie_service.engine.spec.speculator import Speculator

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}  # dynamic
REPEAT = "river mountain city garden river mountain city garden river mountain city garden river mountain"


class StepClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _drafts_per_step(model: Any, cost: Callable[[int], float]) -> list[int]:
    """Each runner call's draft tokens, one greedy stream whose text the proposer remembers (n-gram matches all
    along), every step costing ``cost(its tokens)`` seconds on the engine's step clock."""
    llm = LLM(str(model), num_kv_blocks=200, cache_block_size=16, speculative_config=NGRAM)
    clock, execute, drafts = StepClock(), llm.engine.runner.execute, []

    def timed(out: Any) -> Any:
        clock.t += cost(out.num_tokens)
        drafts.append(sum(c.num_draft for c in out.chunks))
        return execute(out)

    llm.engine.step_clock, llm.engine.runner.execute = clock, timed
    params = SamplingParams(max_tokens=120, temperature=0.0, ignore_eos=True)
    llm.generate([REPEAT], params, use_tqdm=False)  # its text becomes the proposer's memory
    drafts.clear()
    llm.generate([REPEAT], params, use_tqdm=False)  # the same again: n-gram matches all along
    return drafts


def test_speculation_follows_the_step_clock_not_the_machine(tiny_model):
    cheap = _drafts_per_step(tiny_model, lambda tokens: 0.010 + 0.0001 * tokens)  # reading weights dominates
    assert set(cheap[1:-1]) == {4} and len(cheap) < 40  # every decode step drafts k = 4: 120 tokens in few calls
    dear = _drafts_per_step(tiny_model, lambda tokens: 0.001 + 0.050 * tokens)  # each token costs about a step
    assert sum(dear) == 0 and len(dear) == 120  # the first pass's measured steps turned it off: one token a call


def test_the_draft_models_share_is_timed_on_the_step_clock():
    """The speculator times the draft model's forwards with the clock the engine hands it (its step clock), so
    that the cost model weighs them against steps measured on the same clock."""
    clock = StepClock()

    class Draft:  # a draft model whose forwards take 30 ms on the step clock
        def propose(self, wants: list, running: set) -> dict[str, list[int]]:
            clock.t += 0.030
            return {s.request_id: [7] * k for s, k in wants}

    cfg = SpeculativeConfig(method="draft_model", num_speculative_tokens=3, model="draft", dynamic=False)
    spec = Speculator(cfg, Draft())  # type: ignore[arg-type]
    seq = Sequence("r", [1, 2, 3], SamplingParams(max_tokens=50, temperature=0.0), 50, seed=0)
    seq.output_token_ids.append(4)
    seq.num_computed_tokens = seq.num_tokens - 1  # decoding its next token
    spec.propose([seq], clock)
    assert seq.draft_token_ids == [7, 7, 7] and spec.costs.draft_s == pytest.approx(0.030 / 3)

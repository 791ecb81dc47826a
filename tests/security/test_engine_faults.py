"""Issue #16, items 5 and 7 (engine side): a request whose logits or sampling values overflow fails alone,
with a clear message and no internal exception text, and never changes a seeded neighbour's tokens;
logprobs stay finite and JSON never carries NaN."""
from __future__ import annotations

import json
import math

import pytest
import torch

from mindie_service import LLM, SamplingParams
from mindie_service.engine.sample.sampler import LOGPROB_FLOOR, NonFiniteRows, Sampler
from mindie_service.engine.sequence import Sequence
from mindie_service.engine.contract import FailedEvent
from mindie_service.errors import ValidationError
from mindie_service.protocol.encoders import sse
from mindie_service.protocol.tgi import parse_tgi_request

N = 12


@pytest.fixture(scope="module")
def llm(tiny_model) -> LLM:
    return LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=64)


def _run(llm: LLM, requests: list[tuple[str, SamplingParams]], poison: str | None = None,
         poison_from: int = 2) -> tuple[dict[str, list[int]], dict[str, str]]:
    """Drive the engine; the logits row of ``poison`` turn NaN from its ``poison_from``-th sampled token on."""
    eng = llm.engine
    real = eng.runner.execute
    seen: dict[str, int] = {}

    def execute(out):  # noqa: ANN001, ANN202 - wraps ModelRunner.execute
        result = real(out)
        for row, chunk in enumerate(out.sampled):
            seen[chunk.request_id] = seen.get(chunk.request_id, 0) + 1
            if chunk.request_id == poison and seen[chunk.request_id] > poison_from:
                with torch.inference_mode():
                    result.logits[row] = float("nan")
        return result

    eng.runner.execute = execute
    try:
        tokens: dict[str, list[int]] = {rid: [] for rid, _ in requests}
        failed: dict[str, str] = {}
        for rid, p in requests:
            eng.add_request(llm.input_processor.process(_text(), p, request_id=rid))
        while eng.has_work():
            for ev in eng.step():
                if isinstance(ev, FailedEvent):
                    failed[ev.request_id] = ev.message
                else:
                    tokens[ev.request_id].append(ev.token.id)
        return tokens, failed
    finally:
        eng.runner.execute = real


def _text():
    from mindie_service.inputs import TextPrompt
    return TextPrompt("River mountain city garden teacher window")


def _seeded(seed: int = 7) -> SamplingParams:
    return SamplingParams(max_tokens=N, temperature=1.0, top_k=50, seed=seed, ignore_eos=True)


def test_non_finite_logits_fail_one_request_and_leave_a_seeded_neighbour_unchanged(llm):
    alone, _ = _run(llm, [("a0", _seeded())])
    # The poisoned request samples too and comes first: on the old code its multinomial raised after the
    # seeded row had drawn, and the one-at-a-time re-run drew again (a different stream).
    tokens, failed = _run(llm, [("bad", SamplingParams(max_tokens=N, temperature=1.0, seed=3, ignore_eos=True)),
                                ("a1", _seeded())], poison="bad")
    assert set(failed) == {"bad"}
    assert "non-finite logits" in failed["bad"] and "bad" in failed["bad"]
    assert "Error" not in failed["bad"] and "Traceback" not in failed["bad"]  # no internal exception text
    assert tokens["a1"] == alone["a0"]
    assert llm.engine.stats().running == 0 and llm.engine.stats().free_blocks == llm.engine.stats().total_blocks


def test_greedy_request_with_nan_logits_fails_instead_of_emitting_token_zero(llm):
    tokens, failed = _run(llm, [("g", SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True))],
                          poison="g", poison_from=1)
    assert "g" in failed
    assert 0 not in tokens["g"][1:]  # old code: argmax over NaN picked token 0 and went on


def test_sampler_checks_every_row_before_any_generator_draws():
    s = Sampler()
    p = SamplingParams(max_tokens=4, temperature=1.0, seed=5)
    seqs = [Sequence(f"r{i}", [1, 2, 3], p, 4, 5) for i in range(2)]
    logits = torch.randn(2, 32)
    s.sample(logits, seqs)  # creates both generators
    before = {rid: g.get_state().clone() for rid, g in s._generators.items()}
    logits[1, 3] = float("inf")
    with pytest.raises(NonFiniteRows) as err:
        s.sample(logits, seqs)
    assert err.value.request_ids == ["r1"]
    assert all(torch.equal(s._generators[rid].get_state(), st) for rid, st in before.items())


def test_tiny_temperature_and_penalty_do_not_overflow_in_the_sampler():
    s = Sampler()
    seqs = [Sequence("t", [1, 2, 3], SamplingParams(max_tokens=4, temperature=2e-38, seed=1), 4, 1),
            Sequence("p", [1, 2, 3], SamplingParams(max_tokens=4, temperature=0.7, repetition_penalty=2e-38,
                                                    seed=1), 4, 1)]
    logits = torch.randn(2, 32) * 10
    out = s.sample(logits, seqs)  # old code: inf/NaN probabilities -> multinomial raised for the batch
    assert out.token_ids[0] == int(logits[0].argmax())  # a temperature near 0 is greedy


def test_logprobs_are_floored_and_json_refuses_nan():
    s = Sampler()
    seqs = [Sequence("x", [1], SamplingParams(max_tokens=2, temperature=0.0, logprobs=3), 2, 1)]
    logits = torch.full((1, 8), float("-inf"))
    logits[0, 2] = 0.0
    out = s.sample(logits, seqs)
    assert out.token_ids == [2]
    assert all(math.isfinite(lp) and lp >= LOGPROB_FLOOR for _, lp in out.top[0])
    assert min(lp for _, lp in out.top[0]) == LOGPROB_FLOOR  # -inf became OpenAI's -9999.0
    with pytest.raises(ValueError):
        sse({"logprob": float("nan")})
    json.loads(sse({"logprob": LOGPROB_FLOOR}).decode()[len("data: "):])


@pytest.mark.parametrize("params", [{"repetition_penalty": 1e-300, "do_sample": True},
                                    {"temperature": 1e-40}])
def test_values_float32_cannot_hold_are_refused(params):
    from mindie_service.protocol.request import ProtocolLimits
    with pytest.raises(ValidationError, match="32-bit float"):
        parse_tgi_request({"inputs": "hi", "parameters": params}, ProtocolLimits(vocab_size=100), stream=False)

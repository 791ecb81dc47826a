"""The sampler's maths through its public ``Sampler.sample``, against transformers' logits processors.

Penalties are deterministic: greedy rows must pick the argmax of transformers' processed scores. The warps
(temperature, top-k, top-p, typical-p) shape a distribution: thousands of rows with their own seeds, drawn in
one call, must never draw a token transformers' warpers remove and must draw the others at the rates the
warped softmax gives. Each case first checks that its parameters really move the distribution, so a sampler
that ignored them could not pass."""
from __future__ import annotations

import pytest
import torch
from transformers import (LogitsProcessorList, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                          TopKLogitsWarper, TopPLogitsWarper, TypicalLogitsWarper)

from mindie_service.engine.sample.sampler import Sampler
from mindie_service.engine.sequence import Sequence
from mindie_service.sampling_params import SamplingParams

V = 8
# Distinct gaps, no ties: every cut-off (top-k, top-p mass, typical-p mass) falls between two tokens.
LOGITS = torch.tensor([2.3, 1.7, 1.2, 0.8, 0.1, -0.4, -1.1, -2.5])
DRAWS = 4000
TOL = 0.035  # > 4 standard deviations of a frequency over 4000 draws


def seq(rid: str, params: SamplingParams, prompt: list[int] | None = None, output: list[int] | None = None,
        seed: int = 0) -> Sequence:
    s = Sequence(rid, list(prompt or [0]), params, max_output=16, seed=seed)
    s.output_token_ids = list(output or [])
    return s


def hf_reference(logits: torch.Tensor, history: list[int], *, temperature: float = 1.0, top_k: int = 0,
                 top_p: float = 1.0, typical_p: float = 1.0, repetition_penalty: float = 1.0) -> torch.Tensor:
    """transformers' processors in generate()'s order -> probabilities of one row."""
    procs = LogitsProcessorList()
    if repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(repetition_penalty))
    if temperature != 1.0:
        procs.append(TemperatureLogitsWarper(temperature))
    if top_k:
        procs.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p))
    if typical_p < 1.0:
        procs.append(TypicalLogitsWarper(typical_p))
    scores = procs(torch.tensor([history]), logits[None].clone().double())
    return scores.softmax(-1)[0].float()


WARP_CASES = [
    dict(temperature=0.6),
    dict(temperature=1.8),
    dict(top_k=3),
    dict(top_p=0.7),
    dict(typical_p=0.5),
    dict(temperature=1.3, top_k=6, top_p=0.9, typical_p=0.8),
    dict(temperature=0.8, repetition_penalty=1.8),
]


@pytest.mark.parametrize("case", WARP_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_sampled_frequencies_follow_transformers_warpers(case):
    prompt, output = [0, 3], [1]  # tokens 0, 1 and 3 are in the history (only the repetition penalty sees it)
    want = hf_reference(LOGITS, prompt + output, **case)
    assert (want - LOGITS.softmax(-1)).abs().max() > 2 * TOL  # the parameters matter for this distribution
    params = SamplingParams(max_tokens=16, **case)
    seqs = [seq(f"r{i}", params, prompt, output, seed=1000 + i) for i in range(DRAWS)]
    got = Sampler().sample(LOGITS.repeat(DRAWS, 1), seqs).token_ids
    freq = torch.bincount(torch.tensor(got), minlength=V).float() / DRAWS
    removed = (want == 0).nonzero()[:, 0].tolist()
    assert all(freq[t] == 0 for t in removed), (removed, freq.tolist())  # never a token the warpers removed
    torch.testing.assert_close(freq, want, atol=TOL, rtol=0)


@pytest.mark.parametrize("penalty", [0.6, 1.3, 2.5])
def test_repetition_penalty_picks_transformers_argmax(penalty):
    """Over prompt and output alike, dividing positive and multiplying negative scores (transformers' rule)."""
    g = torch.Generator().manual_seed(int(penalty * 10))
    vocab, rows = 40, 200
    logits = torch.randn(rows, vocab, generator=g) * 3
    seqs, want, changed = [], [], 0
    for r in range(rows):
        top = logits[r].topk(3).indices.tolist()
        # A penalty > 1 demotes the leader it has seen; one < 1 promotes the runner-up it has seen.
        prompt = [top[0] if penalty > 1 else top[1]] + torch.randint(0, vocab, (3,), generator=g).tolist()
        output = [top[2]] if r % 2 else []
        processed = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([prompt + output]), logits[r:r + 1].clone())
        want.append(int(processed.argmax()))
        changed += want[-1] != int(logits[r].argmax())
        seqs.append(seq(f"r{r}", SamplingParams(temperature=0.0, repetition_penalty=penalty), prompt, output))
    assert changed > rows // 10  # the penalty decides many of these rows
    assert Sampler().sample(logits, seqs).token_ids == want


def test_frequency_penalty_subtracts_per_output_occurrence_only():
    """OpenAI's rule: logit - penalty * (times the token was generated); prompt tokens do not count."""
    logits = torch.tensor([[3.0, 2.5, 2.0, 0.0], [3.0, 2.5, 2.0, 0.0], [3.0, 2.5, 2.0, 0.0]])
    p = SamplingParams(temperature=0.0, frequency_penalty=0.3)
    seqs = [seq("a", p, prompt=[0, 0, 0], output=[]),  # only in the prompt: not penalised -> 0
            seq("b", p, prompt=[1], output=[0, 0]),  # 3.0 - 0.6 = 2.4 < 2.5 -> 1
            seq("c", p, prompt=[2], output=[0, 0, 0, 0, 1, 1, 1])]  # 1.8, 1.6, 2.0 -> 2
    assert Sampler().sample(logits, seqs).token_ids == [0, 1, 2]


def test_logprobs_are_the_raw_log_softmax_whatever_the_warps():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 30, generator=g)
    params = [SamplingParams(temperature=0.0, logprobs=3),
              SamplingParams(temperature=0.5, top_k=4, seed=7, logprobs=5),
              SamplingParams(temperature=1.0, repetition_penalty=2.0, seed=8),
              SamplingParams(temperature=1.2, top_p=0.5, typical_p=0.7, seed=9, logprobs=1)]
    seqs = [seq(f"r{i}", p, prompt=[1, 2], seed=i) for i, p in enumerate(params)]
    res = Sampler().sample(logits, seqs)
    raw = logits.log_softmax(-1)
    for r, (tok, lp) in enumerate(zip(res.token_ids, res.logprobs)):
        assert lp == pytest.approx(raw[r, tok].item(), abs=1e-6)
        n = params[r].logprobs or 0
        vals, idx = raw[r].topk(n) if n else (torch.empty(0), torch.empty(0, dtype=torch.long))
        assert [t for t, _ in res.top[r]] == idx.tolist()
        assert [v for _, v in res.top[r]] == pytest.approx(vals.tolist(), abs=1e-6)


def test_a_seeded_row_draws_the_same_token_alone_or_in_any_batch():
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(6, 50, generator=g)
    mine = SamplingParams(temperature=1.5, seed=42)
    alone = [Sampler().sample(logits[2:3], [seq("me", mine, seed=42)]).token_ids[0] for _ in range(2)]
    others = [seq(f"o{i}", SamplingParams(temperature=1.0), seed=100 + i) for i in range(5)]
    batch = others[:2] + [seq("me", mine, seed=42)] + others[2:]
    assert alone[0] == alone[1] == Sampler().sample(logits, batch).token_ids[2]
    shuffled = [others[4], seq("me", mine, seed=42), others[0]]
    assert Sampler().sample(logits[[5, 2, 0]], shuffled).token_ids[1] == alone[0]

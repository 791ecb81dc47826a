"""OpenAI's presence penalty and logit bias in the sampler: exact effect on the logits, per row."""
from __future__ import annotations

import torch

from mindie_service.engine.sample.sampler import Sampler
from mindie_service.engine.sequence import Sequence
from mindie_service.sampling_params import SamplingParams


def _seq(rid: str, out: list[int], **kw) -> Sequence:
    seq = Sequence(rid, [1, 2], SamplingParams(max_tokens=8, temperature=0.0, **kw), 8, seed=0)
    seq.output_token_ids = list(out)
    return seq


def test_logit_bias_moves_greedy_choice_and_leaves_other_rows_alone():
    logits = torch.zeros(2, 10)
    logits[:, 3] = 5.0
    got = Sampler().sample(logits, [_seq("a", [], logit_bias={7: 6.0}), _seq("b", [])])
    assert got.token_ids == [7, 3]
    # Logprobs stay those of the model's own distribution.
    assert abs(got.logprobs[0] - torch.log_softmax(logits[0], -1)[7].item()) < 1e-5


def test_presence_penalty_counts_a_token_once_however_often_it_appeared():
    logits = torch.zeros(1, 10)
    logits[0, 4], logits[0, 5], logits[0, 6] = 3.0, 2.5, 1.0
    # 4 appeared three times, 5 once: with presence 1.0 each loses 1.0 once -> 2.0, 1.5; 4 still wins.
    assert Sampler().sample(logits, [_seq("a", [4, 4, 4, 5], presence_penalty=1.0)]).token_ids == [4]
    # The frequency penalty counts occurrences: 4 loses 3 x 0.5 -> 1.5 < 5's 2.0.
    assert Sampler().sample(logits, [_seq("a", [4, 4, 4, 5], frequency_penalty=0.5)]).token_ids == [5]
    # A negative presence penalty favours tokens already seen.
    assert Sampler().sample(logits, [_seq("a", [6], presence_penalty=-2.0)]).token_ids == [4]  # a tie at 3.0: the first wins
    assert Sampler().sample(logits, [_seq("a", [6, 5], presence_penalty=-2.0)]).token_ids == [5]

"""The one stop rule (engine.output.stop_rule): its order of reasons, and that every path that appends tokens
(single steps, multi-step bursts, accepted speculative runs) stops at the same token for ``stop_token_ids``."""
from __future__ import annotations

from typing import Any

import pytest

from mindie_service import LLM, SamplingParams
from mindie_service.engine.contract import FINISH_EOS, FINISH_LENGTH, FINISH_STOP
from mindie_service.engine.output.stop_rule import StopCheck, stop_reason
from mindie_service.errors import MindieError
from tests.prompts import parity_prompts

EOS = frozenset({2})
NGRAM_FIXED = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1,
               "dynamic": False}


@pytest.mark.parametrize("check, ignore_eos, stop_ids, want", [
    (StopCheck(2, 5, 5, True), False, (7,), FINISH_EOS),  # EOS before a stop string and the cap
    (StopCheck(2, 5, 5, True), True, (), FINISH_STOP),  # ignore_eos: the stop string found by the same token
    (StopCheck(2, 5, 5, False), True, (), FINISH_LENGTH),
    (StopCheck(7, 1, 9, False), False, (7,), FINISH_STOP),  # a stop token id
    (StopCheck(7, 9, 9, False), False, (), FINISH_LENGTH),  # the cap, reached exactly
    (StopCheck(7, 8, 9, False), False, (8,), None),
    (StopCheck(7, 3, 9, True, min_tokens=5), False, (7,), None),  # min_tokens: nothing but the cap stops
    (StopCheck(2, 4, 4, True, min_tokens=5), False, (), FINISH_LENGTH),
    (StopCheck(7, 5, 9, False, min_tokens=5), False, (7,), FINISH_STOP),  # the 5th token may stop
])
def test_reasons_in_their_order(check, ignore_eos, stop_ids, want):
    assert stop_reason(check, EOS, ignore_eos, stop_ids) == want


def test_stop_token_ids_are_checked():
    with pytest.raises(MindieError, match="stop_token_ids"):
        SamplingParams(stop_token_ids=[-1])
    assert SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)


def _ids(llm: LLM, params: list[SamplingParams], prompts: list[str]) -> list[tuple[list[int], str]]:
    return [(r.outputs[0].token_ids, r.outputs[0].finish_reason)
            for r in llm.generate(prompts, params, use_tqdm=False)]


def _pin_bursts(llm: LLM, steps: int) -> None:
    """Bursts of ``steps`` whatever the machine's speed (the pacer would cut them on a slow one)."""
    llm.engine.bursts.observe = lambda seconds, n: steps  # type: ignore[method-assign]


@pytest.mark.parametrize("how", ["single", "bursts", "ngram"])
def test_a_stop_token_ends_every_path_at_its_first_occurrence(tiny_model, how):
    """Each request stops at the first generated token in its ``stop_token_ids`` (a token 12 to 39 of its
    unconstrained greedy output, or an earlier occurrence of it), with finish "stop", whether that token came
    alone, inside a burst or inside an accepted speculative run (n-gram drafts find matches in these outputs)."""
    prompts = parity_prompts()
    free = [SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True) for _ in prompts]
    kw: dict[str, Any] = dict(num_kv_blocks=400, cache_block_size=16)
    base = _ids(LLM(str(tiny_model), **kw, decode_steps=1), free, prompts)
    cut = [12 + (5 * i) % 28 for i in range(len(prompts))]
    stop = [SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, stop_token_ids=[ids[k]])
            for (ids, _), k in zip(base, cut)]
    if how == "single":
        llm = LLM(str(tiny_model), **kw, decode_steps=1)
    elif how == "bursts":
        llm = LLM(str(tiny_model), **kw, decode_steps=8)
        _pin_bursts(llm, 8)
    else:
        llm = LLM(str(tiny_model), **kw, speculative_config=NGRAM_FIXED)
    got = _ids(llm, stop, prompts)
    for (ids, _), k, (out, finish) in zip(base, cut, got):
        first = ids.index(ids[k])  # the stop token may occur earlier than the chosen position
        assert out == ids[:first + 1] and finish == FINISH_STOP
    if how == "ngram":
        assert llm.engine.spec.counters.num_accepted_tokens > 0  # runs were accepted, so cut inside them


@pytest.fixture(scope="module")
def hf_min_tokens(tiny_eos_model):
    """transformers' greedy output with min_new_tokens, for prompts whose free output ends on EOS early."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_eos_model)
    hf = AutoModelForCausalLM.from_pretrained(tiny_eos_model, dtype=torch.float32).eval()
    out = {}
    with torch.inference_mode():
        for prompt in EOS_PROMPTS:
            ids = torch.tensor([prompt])
            for n in (0, 12):
                gen = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, min_new_tokens=n,
                                  do_sample=False, pad_token_id=tok.pad_token_id)
                out[tuple(prompt), n] = gen[0, ids.shape[1]:].tolist()
    return out


EOS_PROMPTS = [[303, 325, 174, 100, 127], [364, 115], [102, 97], [136, 186, 377]]  # tiny-eos: EOS after 29, 9, 19, 7


@pytest.mark.parametrize("decode_steps", [1, 8])
def test_min_tokens_matches_transformers_min_new_tokens(tiny_eos_model, hf_min_tokens, decode_steps):
    """Before min_tokens, EOS is never drawn and nothing stops: the tokens are transformers' with the same
    min_new_tokens (its EOS ban), and the request then stops on EOS as usual. Bursts run where the ban is over."""
    llm = LLM(str(tiny_eos_model), num_kv_blocks=96, cache_block_size=4, decode_steps=decode_steps)
    _pin_bursts(llm, decode_steps)
    for n in (0, 12):
        params = [SamplingParams(max_tokens=40, temperature=0.0, min_tokens=n) for _ in EOS_PROMPTS]
        res = llm.generate(EOS_PROMPTS, params, use_tqdm=False)
        for prompt, r in zip(EOS_PROMPTS, res):
            want = hf_min_tokens[tuple(prompt), n]
            eos = llm.engine.eos_token_ids
            want = want[:next((i + 1 for i, t in enumerate(want) if t in eos), len(want))]  # HF pads after EOS
            assert r.outputs[0].token_ids == want and len(want) > n
    assert hf_min_tokens[tuple(EOS_PROMPTS[3]), 0] != hf_min_tokens[tuple(EOS_PROMPTS[3]), 12][:8]  # the ban bit


def test_min_tokens_is_checked():
    with pytest.raises(MindieError, match="min_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)

"""Beam search in the engine against transformers' generate(num_beams=k, length_penalty=lp, do_sample=False)
on the same weights (the installed transformers' semantics: 2k candidates a step, HF's early-stopping
heuristic). Beams run in the continuous batch: all prompts of a case are generated together."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from mindie_service import LLM, SamplingParams
from mindie_service.errors import ValidationError
from tests.prompts import word_prompts

MAX_NEW = 14


@pytest.fixture(scope="module")
def llm(tiny_model):
    return LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=256, max_seq_len=512)


@pytest.fixture(scope="module")
def hf(tiny_model):
    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts():
    return word_prompts(3, 5, 40, seed=11)


def _hf_beam(hf, tok, prompt, k, lp, eos, early="never"):
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), num_beams=k, length_penalty=lp, do_sample=False,
                          max_new_tokens=MAX_NEW, early_stopping=early, eos_token_id=eos,
                          pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else eos)
    return out[0, ids.shape[1]:].tolist()


def _ours(llm, prompts, k, lp, early="never"):
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, num_beams=k, length_penalty=lp,
                            early_stopping=early)
    return [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("lp", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("early", [False, True, "never"])
def test_beam_search_matches_transformers(llm, hf, prompts, k, lp, early):
    eos = next(iter(llm.engine.eos_token_ids))
    got = _ours(llm, prompts, k, lp, early)
    for p, out in zip(prompts, got):
        assert out.token_ids == _hf_beam(hf, llm.tokenizer, p, k, lp, eos, early), p


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("lp", [0.5, 1.0])  # lp 2.0 favours the long hypotheses: EOS ones are found, never best
def test_beam_search_honours_eos_as_transformers(llm, hf, prompts, k, lp):
    """The tiny model rarely emits its EOS, so a token greedy decoding does emit is made the EOS on both sides:
    hypotheses end there, the finished set and the early-stopping heuristic come into play."""
    greedy = llm.generate(prompts[:1], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
                          use_tqdm=False)[0].outputs[0].token_ids
    eos = greedy[3]
    eng = llm.engine
    saved = eng.outputs.eos_token_ids, eng.beams.eos
    eng.outputs.eos_token_ids = eng.beams.eos = frozenset({eos})
    try:
        got = _ours(llm, prompts, k, lp, early=False)
    finally:
        eng.outputs.eos_token_ids, eng.beams.eos = saved
    ended = 0
    for p, out in zip(prompts, got):
        ref = _hf_beam(hf, llm.tokenizer, p, k, lp, eos, early=False)
        assert out.token_ids == ref, p
        if ref and ref[-1] == eos:
            ended += 1
            assert out.finish_reason == "eos_token"
    if lp == 0.5:  # short hypotheses win: some best beam really ends on EOS (with 1.0 that depends on k)
        assert ended >= 1


def test_beams_share_blocks_and_free_everything(llm, prompts):
    eng = llm.engine
    free0 = eng.blocks.num_free_blocks
    _ours(llm, prompts, 4, 1.0)
    assert not eng.scheduler.has_work() and not eng.beams.groups
    assert all(r == 0 for r in eng.blocks.ref_counts) and eng.blocks.num_free_blocks == free0


def test_beams_batch_with_greedy_requests_without_changing_either(llm, prompts):
    greedy = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
    beam = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, num_beams=2)
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
    beams_alone = [o.outputs[0].token_ids for o in llm.generate(prompts, beam, use_tqdm=False)]
    mixed = llm.generate(prompts + prompts, [greedy] * 3 + [beam] * 3, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mixed[:3]] == alone
    assert [o.outputs[0].token_ids for o in mixed[3:]] == beams_alone


def test_beam_refusals_name_the_rule(llm):
    with pytest.raises(ValidationError, match="num_beams must be 1 when sampling"):
        SamplingParams(num_beams=2, temperature=0.7)
    with pytest.raises(ValidationError, match="num_beams must be 1 when logprobs"):
        llm.generate(["hello"], SamplingParams(temperature=0.0, num_beams=2, logprobs=2), use_tqdm=False)

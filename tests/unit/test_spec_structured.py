"""Speculative decoding composes with structured output: a constrained row speculates (the acceptance counters
move with only constrained rows in the batch), each verify row is masked by the grammar's state after the
drafts before it, drafts the grammar forbids are cut before the verify, and greedy (and seeded) output is
token-identical to unspeculated constrained decoding on the 16-prompt parity set, on both proposers, with
forced runs on and off; every answer validates against its schema."""
from __future__ import annotations

import json

import jsonschema
import pytest

from mindie_service import LLM, SamplingParams
from mindie_service.devkit.presets import build_demo_model
from mindie_service.structured.backend import StructuredLimits
from tests.conftest import ROOT
from tests.prompts import parity_prompts

POOL = dict(num_kv_blocks=400, cache_block_size=16)
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1,
         "dynamic": False}
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags", "ok"],
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 200},
                         "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
                         "ok": {"type": "boolean"}}}
LIST = {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 2, "maxItems": 6}


@pytest.fixture(scope="module")
def tiny_draft() -> str:
    return str(build_demo_model("tiny-draft", ROOT / "models" / "tiny-draft", if_missing=True))


def _params(temperature: float = 0.0) -> list[SamplingParams]:
    """Two schemas; logprobs (forced runs off for those rows) on some; caps that cut some objects short."""
    return [SamplingParams(max_tokens=90 if i % 5 else 14, temperature=temperature, seed=i,
                           logprobs=1 if i % 4 == 1 else None,
                           structured_outputs={"json": SCHEMA if i % 3 else LIST}) for i in range(16)]


def _out(res) -> list[tuple]:
    return [(r.outputs[0].token_ids, r.outputs[0].text, r.outputs[0].finish_reason) for r in res]


def _logprobs(res) -> list:
    return [[{t: round(v, 3) for t, v in p.items()} for p in r.outputs[0].logprobs or []] for r in res]


def _same_logprobs(a, b) -> None:
    for x, y in zip(a, b):
        assert [p.keys() for p in x] == [p.keys() for p in y]
        assert all(abs(p[t] - q[t]) < 2e-3 for p, q in zip(x, y) for t in p)


def _valid(res) -> None:
    for i, r in enumerate(res):
        o = r.outputs[0]
        if o.finish_reason != "length":
            jsonschema.validate(json.loads(o.text), SCHEMA if i % 3 else LIST)


@pytest.fixture(scope="module")
def baseline(tiny_model):
    res = {f: LLM(str(tiny_model), **POOL, structured=StructuredLimits(forced_runs=f))
           .generate(parity_prompts(), _params(), use_tqdm=False) for f in (True, False)}
    return {f: _out(r) for f, r in res.items()} | {"logprobs": _logprobs(res[True])}


def _speculated(llm: LLM) -> None:
    st = llm.engine.stats()
    assert st.spec_num_drafts > 0 and st.spec_num_accepted_tokens > 0  # constrained rows did speculate
    assert llm.engine.grammar.stats.draft_masks > 0  # and their verify rows were masked


@pytest.mark.parametrize("forced", [True, False])
def test_greedy_ngram_constrained_is_token_identical(tiny_model, baseline, forced):
    llm = LLM(str(tiny_model), **POOL, speculative_config=NGRAM, structured=StructuredLimits(forced_runs=forced))
    for _ in range(2):  # the second pass drafts from the first's text (memory)
        res = llm.generate(parity_prompts(), _params(), use_tqdm=False)
        assert _out(res) == baseline[forced]
        _same_logprobs(_logprobs(res), baseline["logprobs"])
        _valid(res)
    _speculated(llm)
    assert llm.engine.spec.forced_drafts > 0  # the grammar's forced bytes were drafted (rows with logprobs)


def test_greedy_draft_model_constrained_is_token_identical(tiny_model, tiny_draft, baseline):
    spec = {"method": "draft_model", "model": tiny_draft, "num_speculative_tokens": 3, "dynamic": False}
    llm = LLM(str(tiny_model), **POOL, speculative_config=spec)
    res = llm.generate(parity_prompts(), _params(), use_tqdm=False)
    assert _out(res) == baseline[True]
    _valid(res)
    _speculated(llm)


def test_seeded_constrained_sampling_draws_as_without_speculation(tiny_model):
    prompts, params = parity_prompts()[:8], _params(temperature=1.0)[:8]
    ref = LLM(str(tiny_model), **POOL).generate(prompts, params, use_tqdm=False)
    llm = LLM(str(tiny_model), **POOL, speculative_config=NGRAM)
    for _ in range(2):
        assert _out(llm.generate(prompts, params, use_tqdm=False)) == _out(ref)
    _valid(ref)
    _speculated(llm)


def test_drafts_the_grammar_forbids_are_cut_and_the_rest_verified(tiny_model, baseline):
    """An oracle drafts the unspeculated continuation with one token in three replaced by ``{``: where the grammar
    forbids it (a key, a number, after a value) the draft is cut before the verify, where it allows it (inside a
    string) the target rejects it; the drafts before it are accepted, and the output is identical and valid."""
    llm = LLM(str(tiny_model), **POOL, speculative_config=NGRAM)
    tok = llm.engine.tokenizer
    brace = tok.encode("{", add_special_tokens=False)[0]
    prompts, params = parity_prompts()[:8], _params()[:8]
    ref = {tuple(r.prompt_token_ids): r.prompt_token_ids + r.outputs[0].token_ids
           for r in LLM(str(tiny_model), **POOL).generate(prompts, params, use_tqdm=False)}

    def propose(tokens, index, k, cache_key):
        full = next(v for p, v in ref.items() if tokens[:len(p)] == list(p))
        n = len(tokens)
        return [brace if (n + i) % 3 == 2 else t for i, t in enumerate(full[n:n + k])]

    llm.engine.spec.ngram.propose = propose
    res = llm.generate(prompts, params, use_tqdm=False)
    assert _out(res) == baseline[True][:8]
    _valid(res)
    assert llm.engine.spec.grammar_cut > 0  # '{' inside an object or a string's end is refused by the grammar
    _speculated(llm)


def test_verify_row_masks_are_the_states_after_the_drafts_and_the_matcher_is_left_as_it_came(tiny_model):
    """GrammarMasks's verify-row masks (one native call for the batch) equal consuming the drafts one by one and
    filling each state's mask; one draft and several; the matcher's state is unchanged afterwards."""
    import torch
    from transformers import AutoTokenizer

    from mindie_service.engine.sample.grammar_masks import GrammarState, GrammarMasks
    from mindie_service.engine.spec.speculator import DraftRow
    from mindie_service.structured.compiler import build_compiler
    from mindie_service.structured.grammar_spec import json_spec

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    comp = build_compiler(tok, [tok.eos_token_id], StructuredLimits())
    step = GrammarMasks(comp, comp.vocab_size, frozenset([tok.eos_token_id]), True)
    text = tok.encode('{"name":"Ada","age":36,"tags":["red"],"ok":true}', add_special_tokens=False)
    seqs, want, matchers = [], [], []
    for start, k in ((0, 5), (3, 1), (6, 4)):
        m = comp.matcher(json_spec(SCHEMA, "x"))
        for t in text[:start]:
            assert m.consume(t)
        parent = type("Seq", (), {"grammar": GrammarState(m, True), "output_token_ids": text[:start]})()
        drafts = text[start:start + k]
        for j in range(1, k + 1):
            seqs.append(DraftRow("r", None, 0, [], text[:start] + drafts[:j], parent, j))
            assert m.consume(drafts[j - 1])
            buf = torch.zeros(1, step.words, dtype=torch.int32)
            comp.fill_masks([(m, 0)], buf)
            want.append(buf[0])
        assert m.rollback(k)
        matchers.append((m, start))

    def states() -> list:
        buf = torch.zeros(len(matchers), step.words, dtype=torch.int32)
        comp.fill_masks([(m, i) for i, (m, _) in enumerate(matchers)], buf)
        return [buf, [m.validate(text[start:]) for m, start in matchers]]

    before = states()
    got = step._draft_masks(list(enumerate(seqs)))
    assert all(torch.equal(got[r], want[r]) for r in range(len(seqs)))
    assert step.stats.draft_masks == len(seqs) == 10
    after = states()
    assert torch.equal(after[0], before[0]) and after[1] == before[1] == [len(text) - st for st in (0, 3, 6)]

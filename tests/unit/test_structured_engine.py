"""Structured output in the engine: masks before sampling, forced runs, preemption, chunked prefill, failures."""
from __future__ import annotations

import json

import jsonschema
import pytest

from mindie_service.engine.contract import FailedEvent
from mindie_service.errors import ValidationError
from mindie_service.llm import LLM
from mindie_service.sampling_params import SamplingParams
from mindie_service.structured.backend import StructuredLimits

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags", "ok"],
          "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer", "minimum": 0, "maximum": 200},
                         "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
                         "ok": {"type": "boolean"}}}
PROMPTS = ["Hello", "The weather today", "Once upon a time", "Tell me"]


@pytest.fixture(scope="module")
def llms(tiny_model):
    return {f: LLM(str(tiny_model), structured=StructuredLimits(forced_runs=f)) for f in (True, False)}


def _texts(llm, params, prompts=PROMPTS):
    return [(o.outputs[0].text, o.outputs[0].finish_reason, o.outputs[0].token_ids)
            for o in llm.generate(prompts, params, use_tqdm=False)]


def test_every_answer_validates_against_its_schema(llms):
    for temp in (0.0, 1.0):
        for text, reason, _ in _texts(llms[True], SamplingParams(max_tokens=200, temperature=temp, seed=1,
                                                                 structured_outputs={"json": SCHEMA})):
            assert reason == "eos_token", text
            jsonschema.validate(json.loads(text), SCHEMA)
            assert " " not in text.replace(json.loads(text)["name"], "")  # compact JSON by default


def test_forced_runs_give_the_unforced_greedy_output_token_for_token(llms):
    p = SamplingParams(max_tokens=200, temperature=0.0, structured_outputs={"json": SCHEMA})
    before = llms[True].engine.grammar.stats.forced_tokens
    assert _texts(llms[True], p) == _texts(llms[False], p)
    assert llms[True].engine.grammar.stats.forced_tokens > before  # the forced path did run


def test_regex_choice_and_lark(llms):
    llm = llms[True]
    for text, *_ in _texts(llm, SamplingParams(max_tokens=40, temperature=1.0, seed=5,
                                               structured_outputs={"regex": r"[0-9]{3}-[a-z]{2,5}"})):
        assert __import__("re").fullmatch(r"[0-9]{3}-[a-z]{2,5}", text)
    for text, *_ in _texts(llm, SamplingParams(max_tokens=40, temperature=1.0, seed=2,
                                               structured_outputs={"choice": ["yes", "no", "maybe so"]})):
        assert text in ("yes", "no", "maybe so")
    lark = 'start: "(" num ("+" num)* ")"\nnum: /[1-9][0-9]?/'
    for text, *_ in _texts(llm, SamplingParams(max_tokens=24, temperature=1.0, seed=2,
                                               structured_outputs={"grammar": lark})):
        assert text.startswith("(") and text.endswith(")") or len(text) > 0


def test_cap_first_finishes_with_length(llms):
    for text, reason, ids in _texts(llms[True], SamplingParams(max_tokens=5, temperature=0.0,
                                                               structured_outputs={"json": SCHEMA})):
        assert reason == "length" and len(ids) == 5


def test_preempted_mid_object_and_chunked_prefill_keep_the_matcher_right(tiny_model, llms):
    p = SamplingParams(max_tokens=120, temperature=0.0, structured_outputs={"json": SCHEMA})
    want = _texts(llms[False], p, PROMPTS)
    small = LLM(str(tiny_model), num_kv_blocks=5, cache_block_size=16, max_batch_size=8, max_prefill_tokens=16,
                swap_space_gb=0)
    got = _texts(small, p, PROMPTS)
    assert small.engine.scheduler.num_preemptions > 0
    assert got == want


def test_a_failing_grammar_fails_its_request_alone(llms):
    llm = llms[True]
    eng = llm.engine
    good = llm.input_processor.process(__import__("mindie_service.inputs.types", fromlist=["x"]).TextPrompt("Hi"),
                                       SamplingParams(max_tokens=8, temperature=0.0), request_id="good")
    bad = llm.input_processor.process(__import__("mindie_service.inputs.types", fromlist=["x"]).TextPrompt("Hi"),
                                      SamplingParams(max_tokens=8, temperature=0.0,
                                                     structured_outputs={"regex": "ab"}), request_id="bad")
    eng.add_request(good)
    seq = eng.add_request(bad)
    seq.grammar.matcher.consume(999)  # drive the matcher into its error state
    seq.grammar.forced = False
    events = []
    while eng.has_work():
        events += eng.step()
    failed = [e for e in events if isinstance(e, FailedEvent)]
    assert [e.request_id for e in failed] == ["bad"] and "structured output" in failed[0].message
    assert any(getattr(e, "finish_reason", None) for e in events if e.request_id == "good")


def test_bad_grammars_are_refused_with_the_reason_and_beams_by_name(llms):
    llm = llms[True]
    with pytest.raises(ValidationError, match=r"structured_outputs.regex .*unclosed group"):
        llm.generate("x", SamplingParams(structured_outputs={"regex": "a(b"}), use_tqdm=False)
    with pytest.raises(ValidationError, match="structured_outputs.json"):
        llm.generate("x", SamplingParams(structured_outputs={"json": {"type": "nonsense"}}), use_tqdm=False)
    with pytest.raises(ValidationError, match="num_beams"):
        SamplingParams(num_beams=2, temperature=0.0, structured_outputs={"json": SCHEMA})
    with pytest.raises(ValidationError, match="exactly one"):
        SamplingParams(structured_outputs={"json": SCHEMA, "regex": "a"})

    class StructuredOutputsParams:  # vLLM's dataclass shape: its attributes are read
        json = None
        regex = "[0-9]+"
        choice = grammar = json_object = None
    assert SamplingParams(structured_outputs=StructuredOutputsParams()).structured_outputs.kind == "regex"


def _drain(eng) -> dict[str, list]:
    got: dict[str, list] = {}
    while eng.has_work():
        for ev in eng.step():
            assert not isinstance(ev, FailedEvent), ev.message
            got.setdefault(ev.request_id, []).append(ev)
    return got


def test_prefix_cache_and_a_session_continuation_keep_the_output(llms):
    from mindie_service.inputs.types import TextPrompt

    eng, proc = llms[True].engine, llms[True].input_processor
    p = SamplingParams(max_tokens=120, temperature=0.0, structured_outputs={"json": SCHEMA})
    prompt = TextPrompt("River mountain city garden " * 60)  # more than one 128-token block
    texts = []
    for rid in ("cold", "cached"):  # the second finds the first's blocks (forced tokens among them)
        eng.add_request(proc.process(prompt, p, request_id=rid))
        texts.append(_drain(eng)[rid][-1].full_text)
    assert texts[0] == texts[1] and eng.blocks.prefix_hit_rate > 0
    jsonschema.validate(json.loads(texts[0]), SCHEMA)
    eng.add_request(proc.process(prompt, p, request_id="s1", session_id="k"))
    _drain(eng)
    cont = proc.process(TextPrompt(" and again"), p, request_id="s2", session_id="k")
    assert cont.continued and eng.add_request(cont).num_prompt_tokens > len(proc.process(prompt, p, request_id="x")
                                                                            .prompt_token_ids)
    jsonschema.validate(json.loads(_drain(eng)["s2"][-1].full_text), SCHEMA)  # a fresh matcher for the new output

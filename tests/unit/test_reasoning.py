"""The reasoning split (engine.output.reasoning) and the thinking budget, on tiny-think (random weights, a
Qwen3-style template that opens <think>): the budget forces </think>, so the split is deterministic. The split is
exact under any chunking, markers never leak, the budget is honoured to the token, structured output applies to
the answer only, and chat and Messages give the same thinking and answer for one conversation."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
from hypothesis import given, settings, strategies as st

from mindie_service.engine.contract import TokenEvent
from mindie_service.engine.output.reasoning import (ANSWER, OPEN, PARSERS, THINK, ThinkSplit, ThinkTrack, detect,
                                                    start_phase)
from mindie_service.errors import ValidationError
from mindie_service.protocol.anthropic_encoder import AnthropicEncoder
from mindie_service.protocol.anthropic_fields import parse_messages
from mindie_service.protocol.encoders import StreamState
from mindie_service.protocol.openai import parse_openai
from mindie_service.protocol.openai_encoder import OpenAIEncoder
from mindie_service.protocol.reasoning_fields import EFFORT_BUDGETS
from mindie_service.protocol.request import GenerationResult, ProtocolLimits
from mindie_service.structured.tool_formats import FORMATS
from multimodal import MediaPolicy

QWEN = PARSERS["qwen3"]
PIECES = ["a", " ", "\n", "<", "/", "t", "h", "i", "n", "k", ">", "é", "<think", "</thi", "nk>", "</think"]


def _feed(split: ThinkSplit, text: str, cuts: list[int]) -> tuple[str, str]:
    r, a, last = [], [], 0
    for c in sorted(set(cuts)) + [len(text)]:
        x, y = split.feed(text[last:c], final=c == len(text))
        r.append(x)
        a.append(y)
        last = c
    return "".join(r), "".join(a)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=12), st.lists(st.sampled_from(PIECES), max_size=12),
       st.sampled_from(["", " \n", "\n"]), st.booleans(), st.lists(st.integers(0, 80), max_size=8), st.booleans())
def test_the_split_is_exact_under_any_chunking(think, answer, lead, opened, cuts, closed):
    """Thinking (no end marker in it) between the markers, then any answer: the parts are exactly those, fed
    whole or in any chunks; no marker text leaks into the thinking, a partial marker is held, never lost."""
    think_text = "".join(think)
    if QWEN.end in think_text or (not opened and QWEN.start in think_text):
        return
    head = "" if opened else lead + QWEN.start
    text = head + think_text + (QWEN.end + "".join(answer) if closed else "")
    whole = ThinkSplit(QWEN, THINK if opened else OPEN).feed(text, final=True)
    chunked = _feed(ThinkSplit(QWEN, THINK if opened else OPEN), text, [c for c in cuts if c < len(text)])
    assert whole == chunked == (think_text, "".join(answer) if closed else "")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=12), st.lists(st.integers(0, 60), max_size=6))
def test_an_answer_that_never_opens_thinking_is_all_answer(pieces, cuts):
    text = "".join(pieces)
    if text.lstrip().startswith(QWEN.start):
        return
    assert _feed(ThinkSplit(QWEN, OPEN), text, [c for c in cuts if c < len(text)]) == ("", text)
    assert _feed(ThinkSplit(QWEN, ANSWER), text, [c for c in cuts if c < len(text)]) == ("", text)


def test_a_partial_end_marker_at_the_end_is_thinking_text():
    s = ThinkSplit(QWEN, THINK)
    assert s.feed("hm </thi") == ("hm ", "")  # held: it may become the marker
    assert s.feed("", final=True) == ("</thi", "")  # it did not: thinking text, not answer


def test_parsers_come_from_the_template_or_the_config():
    assert detect("{% if enable_thinking %}<think>{% endif %}</think>") is PARSERS["qwen3"]
    assert detect("<|assistant|><think>\n ... </think>") is PARSERS["deepseek_r1"]
    assert detect("{{ messages }}") is None and detect(None) is None
    assert detect("</think>", "none") is None and detect(None, "deepseek_r1") is PARSERS["deepseek_r1"]
    assert start_phase(QWEN, "<|assistant|>\n<think>\n") == THINK
    assert start_phase(QWEN, "<think>\n\n</think>\n\n") == ANSWER
    assert start_phase(QWEN, "<|assistant|>\n") == OPEN


def test_a_multi_token_end_marker_is_not_counted_as_thinking():
    t = ThinkTrack(end_ids=(7, 8, 9), budget=3, thinking=True, answer_from=None)
    for i, tid in enumerate([1, 2, 3]):
        t.token(tid, i, THINK)
    assert t.due() and t.next_forced() == 7
    t.token(7, 3, THINK)
    assert t.next_forced() == 8 and t.count == 3
    t.token(8, 4, THINK)
    t.token(9, 5, THINK)
    assert not t.thinking and t.answer_from == 6 and t.count == 3
    natural = ThinkTrack(end_ids=(7, 8, 9), thinking=True, answer_from=None)
    for i, tid in enumerate([1, 7, 8, 9, 4]):
        natural.token(tid, i, THINK)
    assert natural.count == 1 and natural.answer_from == 4


# ---------------------------------------------------------------------------------------------- the engine
@pytest.fixture(scope="module")
def llm():
    from mindie_service import LLM
    from tests.conftest import _demo
    return LLM(str(_demo("tiny-think")), cache_block_size=16, num_kv_blocks=256, max_iter_times=96, max_seq_len=512)


CONVO = [{"role": "user", "content": "Plan a picnic by the river."}]


def _events(llm, req, rid: str) -> list[TokenEvent]:
    llm.engine.add_request(llm.input_processor.process(req.prompt, req.params, request_id=rid))
    out: list[TokenEvent] = []
    while not out or out[-1].finish_reason is None:
        out += [e for e in llm.engine.step() if e.request_id == rid]
    return out


def _chat(body: dict, rid: str = "c1"):
    return parse_openai({"model": "m", "messages": CONVO, "temperature": 0, **body}, "chat",
                        limits=ProtocolLimits(vocab_size=4096), model="m", request_id=rid, tool_format=FORMATS["hermes"])


def _result(events: list[TokenEvent]) -> GenerationResult:
    r = GenerationResult()
    for e in events:
        r.add(e)
    return r


@pytest.mark.parametrize("budget", [0, 1, 5, 12])
def test_the_budget_forces_the_end_marker_after_exactly_budget_tokens(llm, budget):
    end_id = llm.tokenizer.convert_tokens_to_ids("</think>")
    req = _chat({"max_tokens": 30, "thinking_token_budget": budget})
    r = _result(_events(llm, req, f"b{budget}"))
    ids = [t.id for t in r.tokens]
    assert r.reasoning_tokens == budget and ids[budget] == end_id and end_id not in ids[:budget]
    assert r.full_reasoning == llm.tokenizer.decode(ids[:budget]) and "".join(r.reasoning_deltas) == r.full_reasoning
    from mindie_service import SamplingParams  # the offline API hands the thinking out beside the answer
    off = llm.generate([llm.input_processor.chat.render(req.prompt.messages)],
                       SamplingParams(max_tokens=budget + 2, temperature=0, thinking_budget=budget, split_reasoning=True),
                       use_tqdm=False)[0].outputs[0]
    assert off.token_ids[budget] == end_id and off.reasoning_content == llm.tokenizer.decode(off.token_ids[:budget])
    assert "".join(r.deltas) == r.text == llm.tokenizer.decode(ids[budget + 1:])
    for part in (r.reasoning, r.text):
        assert "<think>" not in part and "</think>" not in part


def test_streamed_chat_and_messages_equal_their_whole_answers_and_each_other(llm):
    chat = _chat({"max_tokens": 24, "thinking_token_budget": 6, "stream": True}, "s1")
    msgs = parse_messages({"model": "m", "max_tokens": 24, "temperature": 0, "stream": True, "messages": CONVO,
                           "thinking": {"type": "enabled", "budget_tokens": 6}}, model="m", policy=MediaPolicy(),
                          vocab_size=4096, request_id="s2", tool_format=FORMATS["hermes"])
    assert chat.prompt.messages == msgs.prompt.messages and chat.params == msgs.params
    ev_c, ev_m = _events(llm, chat, "s1"), _events(llm, msgs, "s2")
    rc, rm = _result(ev_c), _result(ev_m)
    oe, ae = OpenAIEncoder(), AnthropicEncoder()
    whole = oe.complete(chat, [rc])["choices"][0]["message"]
    st_c, frames, acc = StreamState(), b"", _result([])
    for e in ev_c:
        acc.add(e)
        frames += oe.stream_frame(chat, e, acc, st_c)
    deltas = [json.loads(f[6:])["choices"][0]["delta"] for f in frames.decode().split("\n\n") if f.startswith("data: {")]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == whole["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == whole["content"]
    assert oe.complete(chat, [rc])["usage"]["completion_tokens_details"] == {"reasoning_tokens": 6}
    blocks = ae.complete(msgs, [rm])["content"]
    assert blocks[0] == {"type": "thinking", "thinking": whole["reasoning_content"], "signature": ""}
    assert blocks[1] == {"type": "text", "text": whole["content"]}
    st_m, acc, thinking, text = StreamState(), _result([]), "", ""
    for e in ev_m:
        acc.add(e)
        for frame in ae.stream_frame(msgs, e, acc, st_m).decode().split("\n\n"):
            body = json.loads(frame.split("data: ", 1)[1]) if "data: " in frame else {}
            d = body.get("delta", {})
            thinking += d.get("thinking", "") if d.get("type") == "thinking_delta" else ""
            text += d.get("text", "") if d.get("type") == "text_delta" else ""
    assert (thinking, text) == (whole["reasoning_content"], whole["content"])


SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
          "required": ["ok", "n"], "additionalProperties": False}


def test_json_schema_applies_to_the_answer_only(llm):
    free = _result(_events(llm, _chat({"max_tokens": 40, "thinking_token_budget": 8}), "j0"))
    req = _chat({"max_tokens": 40, "thinking_token_budget": 8,
                 "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}})
    r = _result(_events(llm, req, "j1"))
    assert r.full_reasoning == free.full_reasoning  # the thinking was not constrained
    jsonschema.validate(json.loads(r.text), SCHEMA)


def test_thinking_disabled_renders_the_closed_template_and_has_no_thinking(llm):
    off = _chat({"max_tokens": 8, "reasoning_effort": "none"})
    assert off.prompt.template_kwargs == (("enable_thinking", False),)
    r = _result(_events(llm, off, "d1"))
    assert r.full_reasoning == "" and r.reasoning_tokens == 0 and len(r.text) > 0
    from mindie_service.protocol.tokenization import parse_tokenize
    tok = parse_tokenize({"messages": CONVO, "chat_template_kwargs": {"enable_thinking": False}})
    kw = _chat({"max_tokens": 8, "chat_template_kwargs": {"enable_thinking": False}})
    assert tok.template_kwargs == kw.prompt.template_kwargs  # /tokenize renders what chat renders
    assert kw.prompt.template_kwargs == off.prompt.template_kwargs
    assert llm.input_processor.chat.render(kw.prompt.messages, template_kwargs=kw.prompt.template_kwargs).endswith(
        "<|assistant|>\n<think>\n\n</think>\n\n")
    msgs = parse_messages({"model": "m", "max_tokens": 8, "messages": CONVO, "thinking": {"type": "disabled"}},
                          model="m", policy=MediaPolicy(), vocab_size=4096)
    assert msgs.prompt.template_kwargs == off.prompt.template_kwargs


def test_reasoning_effort_maps_to_budgets_and_bad_values_are_refused():
    assert _chat({"reasoning_effort": "low"}).params.thinking_budget == EFFORT_BUDGETS["low"] == 1024
    assert _chat({"reasoning_effort": "high", "thinking_token_budget": 3}).params.thinking_budget == 3
    for body, field in [({"thinking_token_budget": -1}, "thinking_token_budget"),
                        ({"reasoning_effort": "max"}, "reasoning_effort"),
                        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize")]:
        with pytest.raises(ValidationError, match=re.escape(f"Parameter {field} ")):
            _chat(body)
    with pytest.raises(ValidationError, match=r"^Parameter thinking.budget_tokens "):
        parse_messages({"model": "m", "max_tokens": 8, "messages": CONVO,
                        "thinking": {"type": "enabled", "budget_tokens": 8}}, model="m", policy=MediaPolicy(),
                       vocab_size=4096)


def test_a_budget_on_a_model_that_does_not_think_is_refused(tiny_model):
    from mindie_service import LLM, SamplingParams
    plain = LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=64, max_seq_len=256)
    with pytest.raises(ValidationError, match="does not think"):
        plain.generate(["hi"], SamplingParams(max_tokens=4, thinking_budget=2), use_tqdm=False)


def test_the_config_key_turns_the_split_off(llm):
    from mindie_service import LLM, SamplingParams
    from mindie_service.config.loading import structured_limits
    limits = structured_limits({"reasoningParser": "none"})
    assert limits.reasoning_parser == "none"
    off = LLM(llm.engine.cfg.model, cache_block_size=16, num_kv_blocks=64, max_seq_len=256, structured=limits)
    with pytest.raises(ValidationError, match="does not think"):
        off.generate(["hi"], SamplingParams(max_tokens=4, thinking_budget=2), use_tqdm=False)
    r = _result(_events(off, _chat({"max_tokens": 6}), "n1"))
    assert r.full_reasoning is None and "".join(r.deltas) == r.text


def test_tiny_think_matches_transformers_and_its_thinking_is_the_plain_greedy_run(llm):
    """The preset's two added rows load as transformers loads them (token-for-token greedy), and a budget longer
    than the run changes nothing: the thinking is the unconstrained greedy text."""
    import torch
    from transformers import AutoModelForCausalLM
    from mindie_service import SamplingParams
    text = llm.input_processor.chat.render(_chat({}).prompt.messages)
    ids = llm.tokenizer(text, add_special_tokens=False).input_ids
    ref = AutoModelForCausalLM.from_pretrained(llm.engine.cfg.model, torch_dtype=torch.float32)
    want = ref.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False)[0, len(ids):].tolist()
    got = llm.generate([ids], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, thinking_budget=50,
                                             split_reasoning=True), use_tqdm=False)[0].outputs[0]
    assert got.token_ids == want and got.reasoning_content == llm.tokenizer.decode(want) and got.text == ""

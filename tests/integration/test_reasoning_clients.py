"""Reasoning through the clients, unmodified, against a live server on tiny-think (a Qwen3-style thinking
template, random weights; the budget forces </think>): the ``openai`` client reads ``reasoning_content`` streamed
and whole alike, the ``anthropic`` SDK's ``messages.create`` and ``messages.stream`` give the same thinking block
and text, chat and Messages agree; MindIE's ``thinking_budget`` keeps the text whole."""
from __future__ import annotations

import anthropic
import openai
import pytest
import requests

from tests.server_utils import ServerProcess, shared_server, write_config

pytestmark = pytest.mark.slow
ASK = [{"role": "user", "content": "Plan a picnic by the river."}]


@pytest.fixture(scope="module")
def think_model():
    from tests.conftest import _demo
    return _demo("tiny-think")


@pytest.fixture(scope="module")
def srv(request, think_model) -> ServerProcess:
    return shared_server("think", request, lambda tmp: ServerProcess(
        write_config(tmp / "config.json", think_model, model_name="think"), tmp / "server.log"))


def test_chat_and_messages_give_one_thinking_and_answer_streamed_and_whole(srv):
    oai = openai.OpenAI(base_url=srv.url() + "/v1", api_key="none", max_retries=0)
    claude = anthropic.Anthropic(base_url=srv.url(), api_key="none", max_retries=0)
    chat = oai.chat.completions.create(model="think", max_tokens=20, temperature=0, messages=ASK,
                                       extra_body={"thinking_token_budget": 5})
    m = chat.choices[0].message
    thinking, answer = m.model_extra["reasoning_content"], m.content
    assert thinking and answer and chat.usage.completion_tokens_details.reasoning_tokens == 5
    streamed = oai.chat.completions.create(model="think", max_tokens=20, temperature=0, messages=ASK, stream=True,
                                           extra_body={"thinking_token_budget": 5})
    parts = [(getattr(c.choices[0].delta, "reasoning_content", None) or "", c.choices[0].delta.content or "")
             for c in streamed if c.choices]
    assert ("".join(p[0] for p in parts), "".join(p[1] for p in parts)) == (thinking, answer)
    kw = dict(model="think", max_tokens=20, messages=ASK, thinking={"type": "enabled", "budget_tokens": 5},
              extra_body={"temperature": 0})
    msg = claude.messages.create(**kw)
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert (msg.content[0].thinking, msg.content[1].text) == (thinking, answer)
    with claude.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in msg.content]


def test_mindie_thinking_budget_keeps_the_text_whole(srv):
    r = requests.post(srv.url() + "/", json={"inputs": "<|user|>\nhi</s>\n<|assistant|>\n<think>\n",
                                              "parameters": {"max_new_tokens": 12, "thinking_budget": 3,
                                                             "details": True}}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()[0]
    assert "</think>" in body["generated_text"]
    assert [t["text"] for t in body["details"]["tokens"]][3] == "</think>"


def test_responses_give_chat_s_thinking_as_a_reasoning_item_streamed_and_whole(srv):
    """The openai client's responses.create, whole and streamed: a reasoning item holding chat's reasoning_content
    for the same conversation (the template's default: thinking), then the message holding its content."""
    oai = openai.OpenAI(base_url=srv.url() + "/v1", api_key="none", max_retries=0)
    chat = oai.chat.completions.create(model="think", max_tokens=20, temperature=0, messages=ASK,
                                       reasoning_effort="low")
    m = chat.choices[0].message
    r = oai.responses.create(model="think", input=ASK, max_output_tokens=20, temperature=0,
                             reasoning={"effort": "low"})
    assert r.reasoning.effort == "low" and r.status == "incomplete"  # 20 tokens of thinking: cut while thinking
    assert [(it.type, it.status) for it in r.output] == [("reasoning", "incomplete")] and not m.content
    assert r.output[0].content[0].text == m.model_extra["reasoning_content"]
    assert r.usage.output_tokens_details.reasoning_tokens == chat.usage.completion_tokens_details.reasoning_tokens > 0
    evs = list(oai.responses.create(model="think", input=ASK, max_output_tokens=20, temperature=0,
                                    reasoning={"effort": "low"}, stream=True))
    assert "".join(e.delta for e in evs if e.type == "response.reasoning_text.delta") == r.output[0].content[0].text
    assert evs[-1].type == "response.incomplete"
    assert [it.model_dump(exclude={"id"}) for it in evs[-1].response.output] == [
        it.model_dump(exclude={"id"}) for it in r.output]

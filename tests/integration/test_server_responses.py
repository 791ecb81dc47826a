"""The OpenAI Responses API through the official ``openai`` client against the tiny model: greedy-identical to
chat completions (whole, streamed, tools, structured), stored responses and previous_response_id (the second
turn's prompt from the prefix cache), ownership per API key, background responses with cancel and a resumed
stream, and an openai-agents Agent running a function tool."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import openai
import pytest
import requests

from tests.server_utils import ServerProcess, launch, wait_until, write_config

KEY_A, KEY_B = "resp-key-a-0123456789abcdef", "resp-key-b-0123456789abcdef"
TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                       "required": ["city"],
                       "additionalProperties": False}}


def responses_server(tmp: Path, tiny_model: Path, **server: Any) -> ServerProcess:
    cfg = write_config(tmp / "config.json", tiny_model,
                       server={"responsesStore": {"dir": str(tmp / "responses")}, "businessApiKeys": [KEY_A, KEY_B],
                               **server},
                       deploy={"maxSeqLen": 4096, "maxInputTokenLen": 512},
                       schedule={"maxIterTimes": 4000, "numKvBlocks": 600, "maxPrefillTokens": 4096})
    return ServerProcess(cfg, tmp / f"server-{len(list(tmp.glob('server*.log')))}.log")


@pytest.fixture(scope="module")
def srv(tmp_path_factory, tiny_model):
    tmp = tmp_path_factory.mktemp("responses")
    s = launch(lambda: responses_server(tmp, tiny_model))
    yield s
    s.stop()


def client(srv: ServerProcess, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url() + "/v1", api_key=key, max_retries=0)


def chat_text(srv: ServerProcess, messages: list[dict[str, Any]], **kw: Any) -> Any:
    r = client(srv).chat.completions.create(model="tiny", messages=messages, temperature=0, **kw)
    return r


CONVERSATION = [{"role": "user", "content": "Tell me about rivers."},
                {"role": "assistant", "content": "Rivers flow."},
                {"role": "user", "content": "And lakes?"}]


def test_whole_and_streamed_are_greedy_identical_to_chat(srv):
    want = chat_text(srv, [{"role": "system", "content": "Be brief."}, *CONVERSATION], max_tokens=24)
    c = client(srv)
    r = c.responses.create(model="tiny", instructions="Be brief.", input=CONVERSATION, max_output_tokens=24,
                           temperature=0)
    assert r.output_text == want.choices[0].message.content
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.input_tokens == want.usage.prompt_tokens and r.usage.output_tokens == 24
    assert r.output[0].content[0].annotations == []
    with c.responses.stream(model="tiny", instructions="Be brief.", input=CONVERSATION, max_output_tokens=24,
                            temperature=0) as stream:
        events = list(stream)
    final = events[-1].response  # (the helper's get_final_response waits for response.completed only)
    assert final.output_text == r.output_text and final.id != r.id
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[1].type == "response.in_progress"
    assert events[-1].type == "response.incomplete"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text


def test_a_tool_call_and_its_answer_round_trip_as_on_chat(srv):
    c = client(srv)
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    want = chat_text(srv, msgs, tools=[{"type": "function", "function": {k: v for k, v in TOOL.items()
                                                                          if k != "type"}}],
                     tool_choice="required", max_tokens=60)
    r = c.responses.create(model="tiny", input=msgs, tools=[TOOL], tool_choice="required", max_output_tokens=60,
                           temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert [(x.name, x.arguments) for x in calls] == [(t.function.name, t.function.arguments)
                                                      for t in want.choices[0].message.tool_calls]
    assert "city" in json.loads(calls[0].arguments) and calls[0].call_id
    text = "".join(p.text for o in r.output if o.type == "message" for p in o.content)
    assert text == (want.choices[0].message.content or "")  # what the model wrote beside the call, if anything
    with c.responses.stream(model="tiny", input=msgs, tools=[TOOL], tool_choice="required", max_output_tokens=60,
                            temperature=0) as stream:
        streamed = list(stream)[-1].response.output
    strip = ("id", "call_id")  # fresh per response
    assert [o.model_dump(exclude=set(strip)) for o in streamed] == [o.model_dump(exclude=set(strip)) for o in r.output]
    # The answer goes back as function_call_output, continuing the stored conversation.
    r2 = c.responses.create(model="tiny", previous_response_id=r.id, max_output_tokens=8, temperature=0,
                            input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}])
    turn = {"role": "assistant", "content": want.choices[0].message.content, "tool_calls": [
        {"id": x.call_id, "type": "function", "function": {"name": x.name, "arguments": x.arguments}} for x in calls]}
    want2 = chat_text(srv, [*msgs, turn, {"role": "tool", "tool_call_id": calls[0].call_id, "content": "sunny"}],
                      max_tokens=8)
    assert r2.output_text == want2.choices[0].message.content and r2.previous_response_id == r.id


def test_text_format_json_schema_is_held(srv):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}},
              "required": ["n"],
              "additionalProperties": False}
    r = client(srv).responses.create(model="tiny", input="A number?", max_output_tokens=40, temperature=0,
                                     text={"format": {"type": "json_schema", "name": "num", "schema": schema}})
    assert isinstance(json.loads(r.output_text)["n"], int)


def test_previous_response_id_continues_with_the_prompt_from_the_prefix_cache(srv):
    c = client(srv)
    first = c.responses.create(model="tiny", input="Tell me a long story about a lighthouse keeper and the sea.",
                               max_output_tokens=40, temperature=0)
    second = c.responses.create(model="tiny", previous_response_id=first.id, input="And then?",
                                max_output_tokens=8, temperature=0)
    want = chat_text(srv, [{"role": "user", "content": "Tell me a long story about a lighthouse keeper and the sea."},
                           {"role": "assistant", "content": first.output_text},
                           {"role": "user", "content": "And then?"}], max_tokens=8)
    assert second.output_text == want.choices[0].message.content
    assert second.usage.input_tokens == want.usage.prompt_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0


def _sessions_held(srv) -> float:
    text = requests.get(srv.url("metrics") + "/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("num_sessions_held{"))


def test_a_stored_response_keeps_its_kv_as_a_session_and_an_unstored_one_does_not(srv):
    """store: true runs the response as the engine's session under its id: its blocks stay pinned (and spill on a
    drain) for the previous_response_id turn; store: false leaves nothing behind."""
    c = client(srv)
    before = _sessions_held(srv)
    c.responses.create(model="tiny", input="Keep me.", max_output_tokens=4, temperature=0, store=False)
    assert _sessions_held(srv) == before
    c.responses.create(model="tiny", input="Keep me too.", max_output_tokens=4, temperature=0)
    assert _sessions_held(srv) == before + 1


def test_stored_responses_retrieve_list_items_delete_and_belong_to_their_key(srv):
    c, other = client(srv), client(srv, KEY_B)
    r = c.responses.create(model="tiny", input=[{"role": "user", "content": f"item {i}"} for i in range(5)],
                           max_output_tokens=3, temperature=0, metadata={"topic": "t"})
    got = c.responses.retrieve(r.id)
    assert got.output_text == r.output_text and got.metadata == {"topic": "t"}
    page = c.responses.input_items.list(r.id, limit=2, order="asc")
    assert [x.content[0].text for x in page.data] == ["item 0", "item 1"] and page.has_more
    rest = c.responses.input_items.list(r.id, after=page.last_id, order="asc")
    assert [x.content[0].text for x in rest.data] == ["item 2", "item 3", "item 4"] and not rest.has_more
    assert [x.content[0].text for x in c.responses.input_items.list(r.id).data][0] == "item 4"  # newest first
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(r.id)  # another key's response is not there for it
    with pytest.raises(openai.NotFoundError):
        other.responses.create(model="tiny", previous_response_id=r.id, input="x", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(r.id)
    c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    unstored = c.responses.create(model="tiny", input="x", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(unstored.id)


def test_errors_are_openais_shape(srv):
    c = client(srv)
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="tiny", input="x", tools=[{"type": "web_search"}])
    assert e.value.body["param"] == "tools[0].type"
    r = requests.get(srv.url() + "/v1/no/such/route", headers={"Authorization": f"Bearer {KEY_A}"})
    assert r.status_code == 404 and r.json()["error"]["message"].startswith("unknown route")


def _running(srv: ServerProcess) -> int:
    return srv.status()["requests"]["running"]


def test_background_completes_and_cancel_frees_the_sequence(srv):
    c = client(srv)
    r = c.responses.create(model="tiny", input=CONVERSATION, max_output_tokens=12, temperature=0, background=True)
    assert r.status == "queued" and r.background
    assert wait_until(lambda: c.responses.retrieve(r.id).status == "incomplete", timeout=60)
    want = chat_text(srv, CONVERSATION, max_tokens=12)
    assert c.responses.retrieve(r.id).output_text == want.choices[0].message.content
    assert c.responses.cancel(r.id).status == "incomplete"  # a finished one answers as it is
    long = c.responses.create(model="tiny", input="Go on forever.", max_output_tokens=3500, temperature=0,
                              background=True)
    assert wait_until(lambda: _running(srv) == 1, timeout=30)
    cancelled = c.responses.cancel(long.id)
    assert cancelled.status == "cancelled" and c.responses.retrieve(long.id).status == "cancelled"
    assert wait_until(lambda: _running(srv) == 0, timeout=10)  # its sequence is freed
    assert c.responses.cancel(long.id).status == "cancelled"  # again: the same answer
    fg = c.responses.create(model="tiny", input="x", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError):
        c.responses.cancel(fg.id)  # only background responses can be cancelled


def test_background_stream_resumes_after_any_event(srv):
    c = client(srv)
    stream = c.responses.create(model="tiny", input=CONVERSATION, max_output_tokens=30, temperature=0,
                                background=True, stream=True)
    head = []
    for ev in stream:
        head.append(ev)
        if len(head) == 6:
            break
    stream.close()
    rid = head[0].response.id
    assert head[0].response.status == "queued"
    tail = list(c.responses.retrieve(rid, stream=True, starting_after=head[-1].sequence_number))
    events = head + tail
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.incomplete"
    again = list(c.responses.retrieve(rid, stream=True, starting_after=-1))
    assert [e.model_dump() for e in again] == [e.model_dump() for e in events]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == \
        c.responses.retrieve(rid).output_text


def test_an_openai_agents_agent_runs_a_function_tool_over_responses(srv):
    """The Agents SDK unmodified, with its default model API (Responses), calls the tool and takes its output."""
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    agents.set_default_openai_client(openai.AsyncOpenAI(base_url=srv.url() + "/v1", api_key=KEY_A),
                                     use_for_tracing=False)
    agents.set_default_openai_api("responses")
    seen: list[str] = []

    @agents.function_tool
    def get_weather(city: Literal["Paris", "Rome", "Oslo"]) -> str:
        """The weather in a city."""
        seen.append(city)
        return f"sunny in {city}"

    agent = agents.Agent(name="weather", instructions="Answer with the tool.", model="tiny", tools=[get_weather],
                         model_settings=agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=64,
                                                             parallel_tool_calls=False),
                         tool_use_behavior="stop_on_first_tool")
    result = agents.Runner.run_sync(agent, "What is the weather in Paris?")
    assert len(seen) == 1 and result.final_output == f"sunny in {seen[0]}"
    call = next(i for i in result.new_items if i.type == "tool_call_item")
    assert call.raw_item.name == "get_weather" and call.raw_item.call_id


def test_chat_store_true_keeps_the_completion_for_its_key(srv):
    """store: true on chat (whole and streamed) keeps the completion, its messages and metadata, read back through
    the openai client's stored-completions calls; another key sees none of it; store: false keeps nothing."""
    a, b = client(srv, KEY_A), client(srv, KEY_B)
    msgs = [{"role": "user", "content": "Tell me about the river."}]
    whole = a.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0, store=True,
                                      metadata={"topic": "river"})
    got = a.chat.completions.retrieve(whole.id)
    assert got.choices[0].message.content == whole.choices[0].message.content and got.metadata == {"topic": "river"}
    chunks = list(a.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0, store=True,
                                            stream=True, metadata={"topic": "stream"}))
    sid = chunks[0].id
    streamed = a.chat.completions.retrieve(sid)
    assert streamed.choices[0].message.content == "".join(c.choices[0].delta.content or "" for c in chunks
                                                          if c.choices) == whole.choices[0].message.content
    plain = a.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, temperature=0)
    listed = [c.id for c in a.chat.completions.list(metadata={"topic": "river"})]
    assert whole.id in listed and sid not in listed and plain.id not in listed
    assert {whole.id, sid} <= {c.id for c in a.chat.completions.list(limit=100)}
    assert [m.content for m in a.chat.completions.messages.list(whole.id)] == ["Tell me about the river."]
    assert a.chat.completions.update(whole.id, metadata={"topic": "lake"}).metadata == {"topic": "lake"}
    with pytest.raises(openai.NotFoundError):
        b.chat.completions.retrieve(whole.id)
    assert whole.id not in [c.id for c in b.chat.completions.list(limit=100)]
    with pytest.raises(openai.NotFoundError):
        a.chat.completions.retrieve(plain.id)
    assert a.chat.completions.delete(whole.id).deleted
    with pytest.raises(openai.NotFoundError):
        a.chat.completions.retrieve(whole.id)
    r = requests.post(srv.url() + "/v1/completions", json={"model": "tiny", "prompt": "x", "store": True},
                      headers={"Authorization": f"Bearer {KEY_A}"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "store", r.text

"""Structured output and tools over HTTP on the demo model, with the unmodified clients: every constrained
answer parses and validates against its schema (jsonschema); tools with each tool_choice, streamed and not;
vLLM's structured_outputs, TGI / MindIE grammar, huggingface_hub, LangChain, batch jobs, n > 1 with seeds,
a LoRA adapter."""
from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import jsonschema
import openai
import pytest

from mindie_service.devkit.lora import build_demo_lora
from tests.server_utils import ServerProcess, shared_server, wait_until, write_config

pytestmark = pytest.mark.slow
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0,
                                                                              "maximum": 120},
                         "city": {"enum": ["Paris", "Rome", "Oslo"]}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                          "properties": {"city": {"type": "string", "maxLength": 10},
                                         "unit": {"enum": ["c", "f"]}}}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["a", "b"],
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": 0,
                                                                            "maximum": 99}}}}}
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def srv(request, tiny_model, tmp_path_factory) -> ServerProcess:
    lora = build_demo_lora(str(tiny_model), str(tmp_path_factory.mktemp("so-lora") / "ad"), rank=4, seed=1)

    def make(tmp: Path) -> ServerProcess:
        (tmp / "models").mkdir()
        (tmp / "in").mkdir()
        cfg = write_config(tmp / "config.json", tiny_model,
                           server={"openAiSupport": "vllm", "batchJobsDir": str(tmp / "jobs"),
                                   "allowedLocalMediaPaths": [str(tmp / "in")]},
                           deploy={"maxSeqLen": 2048, "maxInputTokenLen": 1536, "maxLoras": 2, "maxLoraRank": 16, "modelsDir": str(tmp / "models"),
                                   "LoraModules": [{"name": "ad", "path": str(lora), "baseModelName": "tiny"}]})
        return ServerProcess(cfg, tmp / "server.log")
    return shared_server("structured", request, make)


@pytest.fixture(scope="module")
def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url() + "/v1", api_key="none", max_retries=0)


def _json_schema(schema: dict, name: str = "person") -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def test_response_format_json_schema_and_json_object_validate(client):
    for model in ("tiny", "ad"):  # the base model and a LoRA adapter
        r = client.chat.completions.create(model=model, messages=MSGS, max_tokens=120, temperature=1.0, seed=7, n=2,
                                           response_format=_json_schema(PERSON))
        for c in r.choices:
            assert c.finish_reason == "stop", c.message.content
            jsonschema.validate(json.loads(c.message.content), PERSON)
    r = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=200, temperature=0,
                                       response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # a cap hit first: the text is a prefix of a JSON object (documented, as OpenAI's)
        assert r.choices[0].finish_reason == "length" and r.choices[0].message.content.startswith("{")
    c = client.completions.create(model="tiny", prompt="A person:", max_tokens=120, temperature=0,
                                  extra_body={"response_format": _json_schema(PERSON)})
    jsonschema.validate(json.loads(c.choices[0].text), PERSON)


def test_streamed_json_equals_the_whole_answer(client):
    kw = dict(model="tiny", messages=MSGS, max_tokens=120, temperature=0.8, seed=11,
              response_format=_json_schema(PERSON))
    whole = client.chat.completions.create(**kw).choices[0].message.content
    parts = [ch.choices[0].delta.content or "" for ch in client.chat.completions.create(stream=True, **kw)
             if ch.choices]
    assert "".join(parts) == whole
    jsonschema.validate(json.loads(whole), PERSON)


def test_a_bad_schema_is_a_400_naming_the_field_and_the_reason(client, srv):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MSGS, response_format=_json_schema(
            {"type": "object", "properties": {"a": {"type": "string", "pattern": "a(b"}}}))
    err = e.value.body
    assert err["param"] == "response_format.json_schema.schema" and "unclosed group" in err["message"], err
    r = srv.post("/generate", {"inputs": "x", "parameters": {"grammar": {"type": "regex", "value": "(("}}})
    assert r.status_code == 422 and "grammar.value" in r.json()["error"]


def test_vllm_structured_outputs_regex_choice_and_guided_json(client):
    r = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=30, temperature=1.0, seed=3, n=3,
                                       extra_body={"structured_outputs": {"regex": "[A-Z][a-z]{2,6}-[0-9]{2}"}})
    assert all(re.fullmatch("[A-Z][a-z]{2,6}-[0-9]{2}", c.message.content) for c in r.choices)
    r = client.completions.create(model="tiny", prompt="Pick:", max_tokens=10, temperature=1.0, seed=1,
                                  extra_body={"structured_outputs": {"choice": ["red", "green", "blue"]}})
    assert r.choices[0].text in ("red", "green", "blue")
    r = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=120, temperature=0,
                                       extra_body={"guided_json": PERSON})
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


def test_tgi_and_mindie_grammar(srv):
    body = {"inputs": "A person:", "parameters": {"max_new_tokens": 120, "grammar": {"type": "json", "value": PERSON}}}
    r = srv.post("/generate", body)
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["generated_text"]), PERSON)
    r = srv.post("/", {**body, "parameters": {**body["parameters"], "grammar": {"type": "regex", "value": "[0-9]{4}"}}})
    assert r.status_code == 200, r.text
    got = r.json()
    assert re.fullmatch("[0-9]{4}", (got[0] if isinstance(got, list) else got)["generated_text"]), got
    r = srv.post("/generate_stream", body, stream=True)
    text = "".join(json.loads(line[5:])["token"]["text"] for line in r.iter_lines(decode_unicode=True)
                   if line.startswith("data:") and not json.loads(line[5:])["token"]["special"])
    jsonschema.validate(json.loads(text), PERSON)
    doc = srv.get("/openapi.json").json()
    assert doc["components"]["schemas"]["GenerateRequest"]["properties"]["parameters"]["properties"]["grammar"][
        "x-extension"] is True


def test_huggingface_hub_text_generation_with_grammar(srv, monkeypatch):
    import huggingface_hub.constants
    from huggingface_hub import InferenceClient

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # it talks to our local server only

    out = InferenceClient(base_url=srv.url()).text_generation(
        "A person:", max_new_tokens=120, grammar={"type": "json", "value": PERSON})
    jsonschema.validate(json.loads(out), PERSON)
    chat = InferenceClient(base_url=srv.url() + "/v1").chat_completion(
        MSGS, model="tiny", max_tokens=120, response_format={"type": "json", "value": PERSON})
    jsonschema.validate(json.loads(chat.choices[0].message.content), PERSON)


def _args_ok(call, tools=(WEATHER, ADD)) -> str:
    fn = next(t["function"] for t in tools if t["function"]["name"] == call.function.name)
    jsonschema.validate(json.loads(call.function.arguments), fn["parameters"])
    return fn["name"]


def test_tools_with_each_tool_choice(client):
    kw = dict(model="tiny", messages=MSGS, max_tokens=150, temperature=1.0, seed=5, tools=[WEATHER, ADD])
    r = client.chat.completions.create(tool_choice="required", n=2, parallel_tool_calls=False, **kw)
    for c in r.choices:
        assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1 and c.message.content is None
        assert all(tc.id and tc.type == "function" for tc in c.message.tool_calls)
        [_args_ok(tc) for tc in c.message.tool_calls]
    r = client.chat.completions.create(tool_choice="required", **{**kw, "max_tokens": 400})  # parallel calls
    c = r.choices[0]
    assert c.message.tool_calls and c.finish_reason in ("tool_calls", "length")
    for tc in c.message.tool_calls[:-1] if c.finish_reason == "length" else c.message.tool_calls:
        _args_ok(tc)
    r = client.chat.completions.create(tool_choice={"type": "function", "function": {"name": "add"}}, **kw)
    c = r.choices[0]
    assert c.finish_reason == "stop" and [_args_ok(tc) for tc in c.message.tool_calls] == ["add"]  # OpenAI's
    r = client.chat.completions.create(tool_choice="none", **kw)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content is not None
    r = client.chat.completions.create(tool_choice="auto", parallel_tool_calls=False, **kw)
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length", "tool_calls")
    for tc in c.message.tool_calls or []:
        _args_ok(tc)


def test_streamed_tool_calls_assemble_to_the_whole_answer(client):
    kw = dict(model="tiny", messages=MSGS, max_tokens=150, temperature=0.9, seed=21, tools=[WEATHER, ADD],
              tool_choice="required", parallel_tool_calls=False)
    whole = client.chat.completions.create(**kw).choices[0]
    calls: dict[int, dict] = {}
    finish = None
    for ch in client.chat.completions.create(stream=True, **kw):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        for tc in d.tool_calls or []:
            if tc.id is not None:  # the id and the name come first
                assert tc.index not in calls and tc.function.name
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "args": ""}
            calls[tc.index]["args"] += tc.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    assert finish == whole.finish_reason == "tool_calls"
    assert [(c["id"][-2:], c["name"], c["args"]) for c in calls.values()] == \
        [(t.id[-2:], t.function.name, t.function.arguments) for t in whole.message.tool_calls]


def test_tool_history_round_trip(client):
    msgs = MSGS + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city":"Paris","unit":"c"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, tools=[WEATHER], max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r.usage.prompt_tokens > 40  # the tools and the history were rendered


def test_langchain_structured_output_and_bind_tools(srv):
    lc = pytest.importorskip("langchain_openai")
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        name: str = Field(max_length=12)
        age: int = Field(ge=0, le=120)

    llm = lc.ChatOpenAI(model="tiny", base_url=srv.url() + "/v1", api_key="none", max_tokens=120, temperature=0,
                        max_retries=0)
    got = llm.with_structured_output(Person, method="json_schema").invoke("A person please")
    assert isinstance(got, Person)

    class Add(BaseModel):
        """Add two integers."""
        a: int = Field(ge=0, le=99)
        b: int = Field(ge=0, le=99)
    msg = llm.bind_tools([Add], tool_choice="Add").invoke("What is 2 + 3?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "Add" and set(msg.tool_calls[0]["args"]) == {"a", "b"}
    msg = llm.bind_tools([Add], tool_choice="any").invoke("What is 2 + 3?")  # LangChain's "any": required
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "Add"


def test_batch_job_applies_response_format_to_every_line(srv):
    lines = b"\n".join(json.dumps([{"role": "user", "text": f"Person {i}"}]).encode() for i in range(6)) + b"\n"
    body = {"model": "tiny", "prompt_file_path": {"value": base64.b64encode(lines).decode(), "type": "raw_bytes"},
            "options": {"max_tokens": 120, "temperature": 0, "response_format": _json_schema(PERSON)}}
    r = srv.post("/batch_inference/submit_job", body)
    assert r.status_code == 200, r.text
    job = r.json()["job_id"]
    assert wait_until(lambda: srv.get(f"/batch_inference/job_status?job_id={job}").json()["status"] == "completed",
                      timeout=120)
    recs = [json.loads(x) for x in srv.get(f"/batch_inference/job_results?job_id={job}&kind=success").text.splitlines()]
    assert len(recs) == 6
    for rec in recs:
        jsonschema.validate(json.loads(rec["text"]), PERSON)


def test_batch_job_with_a_bad_schema_is_refused_at_submit(srv):
    """Refused with the field and llguidance's reason (the route's field-error status, as for options.temperature),
    and no job is created, instead of every line failing."""
    total = srv.get("/batch_inference/jobs").json()["total"]
    lines = base64.b64encode(json.dumps([{"role": "user", "text": "Hi"}]).encode()).decode()
    bad = _json_schema({"type": "object", "properties": {"a": {"type": "string", "pattern": "a(b"}}})
    body = {"model": "tiny", "prompt_file_path": {"value": lines, "type": "raw_bytes"},
            "options": {"max_tokens": 8, "response_format": bad}}
    r = srv.post("/batch_inference/submit_job", body)
    err = r.json()["error"]
    assert r.status_code == 422 and "options.response_format.json_schema.schema" in err and "unclosed group" in err, r.text
    assert srv.get("/batch_inference/jobs").json()["total"] == total
    body["options"]["response_format"] = {"type": "json_object"}
    assert srv.post("/batch_inference/submit_job", body).status_code == 200

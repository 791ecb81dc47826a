"""Pathological grammars are answered within the structured-output bounds (lexer states, step fuel: a 400, a 424
or the answer, never a hang), and their neighbours are unharmed: a regex whose automaton has 2^24 states, deep
nesting, a huge enum, a grammar that can never finish (vLLM #10081: an unbounded compile froze the engine)."""
from __future__ import annotations

import concurrent.futures
import json

import pytest
import requests

from tests.server_utils import ServerProcess, shared_server, write_config

pytestmark = pytest.mark.slow
PLAIN = {"model": "tiny", "messages": [{"role": "user", "content": "River mountain city"}], "max_tokens": 24,
         "temperature": 0}


@pytest.fixture(scope="module")
def srv(request, tiny_model) -> ServerProcess:
    return shared_server("structured-bounds", request, lambda tmp: ServerProcess(
        write_config(tmp / "config.json", tiny_model, server={"openAiSupport": "vllm"},
                     deploy={"structuredOutput": {"maxLexerStates": 20000, "stepLexerFuel": 100000}}),
        tmp / "server.log"))


def _chat(srv: ServerProcess, **kw) -> tuple[int, dict]:
    r = srv.post("/v1/chat/completions", {**PLAIN, **kw})
    return r.status_code, r.json()


@pytest.mark.parametrize("name, extra, ok_statuses", [
    ("2^24-state regex", {"structured_outputs": {"regex": "(a|b)*a(a|b){24}"}, "max_tokens": 60}, (200, 424)),
    ("a grammar that never finishes", {"structured_outputs": {"grammar": 'start: x\nx: "a" x'}}, (200, 400, 424)),
    ("a huge enum", {"response_format": {"type": "json_schema", "json_schema": {"name": "e", "schema": {
        "enum": [f"value-{i}-xyz" for i in range(15000)]}}}}, (200,)),
    ("deep nesting", {"response_format": {"type": "json_schema", "json_schema": {"name": "d", "schema": json.loads(
        '{"type":"object","properties":{"a":' * 25 + '{"type":"string","maxLength":4}' + '}}' * 25)}},
        "max_tokens": 400}, (200, 400)),
    ("a schema too large", {"response_format": {"type": "json_schema", "json_schema": {"name": "e", "schema": {
        "enum": [f"value-{i}-xyz" for i in range(30000)]}}}}, (400,)),
])
def test_bounded_and_neighbours_unharmed(srv, name, extra, ok_statuses):
    alone = _chat(srv)[1]["choices"][0]["message"]["content"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        bad = pool.submit(_chat, srv, **extra)
        neighbours = [pool.submit(_chat, srv) for _ in range(3)]
        status, body = bad.result(timeout=600)  # a hang guard: the bound is the grammar's fuel, not a time
        assert status in ok_statuses, (name, status, body)
        for f in neighbours:
            st, nb = f.result(timeout=600)
            assert st == 200 and nb["choices"][0]["message"]["content"] == alone, name
    if status == 400:
        assert body["error"]["message"]
    assert srv.get("/health").status_code == 200


def test_a_schema_nested_past_the_body_limit_is_a_400(srv):
    deep = '{"type":"array","items":' * 5000 + '{}' + '}' * 5000
    body = json.dumps(PLAIN)[:-1] + ',"response_format":{"type":"json_schema","json_schema":{"name":"d","schema":' \
        + deep + '}}}'
    r = requests.post(srv.url() + "/v1/chat/completions", data=body, timeout=60,
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text

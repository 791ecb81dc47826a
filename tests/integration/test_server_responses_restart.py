"""A background response survives ``kill -9``: after the restart it goes on from its recorded tokens, ends as
the uninterrupted greedy generation does, and its resumed stream yields every event once."""
from __future__ import annotations

import sqlite3

import openai
import pytest

from tests.integration.test_server_responses import KEY_A, responses_server
from tests.server_utils import launch, wait_until

PROMPT = [{"role": "user", "content": "Write a very long essay about the history of bridges."}]


def _tokens(db: str, rid: str) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        return con.execute("SELECT COUNT(*) FROM response_tokens WHERE id = ?", (rid,)).fetchone()[0]


@pytest.mark.timeout(600)
def test_kill_9_mid_background_response_resumes_with_no_event_lost_or_repeated(tmp_path, tiny_model):
    srv = launch(lambda: responses_server(tmp_path, tiny_model))
    c = openai.OpenAI(base_url=srv.url() + "/v1", api_key=KEY_A, max_retries=0)
    stream = c.responses.create(model="tiny", input=PROMPT, max_output_tokens=3000, temperature=0,
                                background=True, stream=True)
    head = []
    for ev in stream:
        head.append(ev)
        if len(head) == 40:
            break
    stream.close()
    rid = head[0].response.id
    db = str(tmp_path / "responses" / "responses.sqlite3")
    srv.proc.kill()  # SIGKILL: no drain, no clean-up
    srv.proc.wait(10)
    made = _tokens(db, rid)
    assert 30 <= made < 3000, made
    srv = launch(lambda: responses_server(tmp_path, tiny_model))
    try:
        c = openai.OpenAI(base_url=srv.url() + "/v1", api_key=KEY_A, max_retries=0)
        tail = list(c.responses.retrieve(rid, stream=True, starting_after=head[-1].sequence_number))
        events = head + tail
        assert [e.sequence_number for e in events] == list(range(len(events)))  # none lost, none repeated
        assert events[-1].type == "response.incomplete"
        final = c.responses.retrieve(rid)
        assert final.status == "incomplete" and final.usage.output_tokens == 3000
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == final.output_text
        assert "resuming after the restart" in srv.log_path.read_text()
        want = c.chat.completions.create(model="tiny", messages=PROMPT, max_tokens=3000, temperature=0)
        assert final.output_text == want.choices[0].message.content  # as if it had never stopped
        assert wait_until(lambda: srv.status()["requests"]["running"] == 0, timeout=10)
    finally:
        assert srv.stop() == 0


@pytest.mark.timeout(600)
def test_a_graceful_stop_pauses_background_responses_and_the_next_start_finishes_them(tmp_path, tiny_model):
    srv = launch(lambda: responses_server(tmp_path, tiny_model))
    c = openai.OpenAI(base_url=srv.url() + "/v1", api_key=KEY_A, max_retries=0)
    r = c.responses.create(model="tiny", input=PROMPT, max_output_tokens=3000, temperature=0, background=True)
    db = str(tmp_path / "responses" / "responses.sqlite3")
    assert wait_until(lambda: _tokens(db, r.id) >= 20, timeout=60)
    assert srv.stop() == 0  # SIGTERM: the drain does not wait for it, it stays in progress
    assert 20 <= _tokens(db, r.id) < 3000
    srv = launch(lambda: responses_server(tmp_path, tiny_model))
    try:
        c = openai.OpenAI(base_url=srv.url() + "/v1", api_key=KEY_A, max_retries=0)
        assert wait_until(lambda: c.responses.retrieve(r.id).status == "incomplete", timeout=120)
        assert c.responses.retrieve(r.id).usage.output_tokens == 3000
    finally:
        assert srv.stop() == 0

"""A background response survives ``kill -9``: after the restart it goes on from its recorded tokens, ends as
the uninterrupted greedy generation does, and its resumed stream yields every event once. A graceful stop does
not wait for background responses: it leaves them in progress, and the next start finishes them."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import openai
import pytest

from tests.integration.test_server_responses import KEY_A, responses_server
from tests.server_utils import ServerProcess, launch, wait_until

PROMPT = [{"role": "user", "content": "Write a very long essay about the history of bridges."}]
LONG = 2500  # output tokens: long enough to be cut part-way (maxSeqLen 4096)


def _tokens(db: Path, rid: str) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        return con.execute("SELECT COUNT(*) FROM response_tokens WHERE id = ?", (rid,)).fetchone()[0]


def _client(srv: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url() + "/v1", api_key=KEY_A, max_retries=0)


@pytest.mark.timeout(900)
def test_background_responses_survive_kill_9_and_a_graceful_stop(tmp_path, tiny_model):
    db = tmp_path / "responses" / "responses.sqlite3"
    srv = launch(lambda: responses_server(tmp_path, tiny_model))
    stream = _client(srv).responses.create(model="tiny", input=PROMPT, max_output_tokens=LONG, temperature=0,
                                           background=True, stream=True)
    head = []
    for ev in stream:
        head.append(ev)
        if len(head) == 40:
            break
    stream.close()
    rid = head[0].response.id
    srv.proc.kill()  # SIGKILL: no drain, no clean-up
    srv.proc.wait(10)
    assert 30 <= _tokens(db, rid) < LONG
    srv = launch(lambda: responses_server(tmp_path, tiny_model))
    try:
        c = _client(srv)
        tail = list(c.responses.retrieve(rid, stream=True, starting_after=head[-1].sequence_number))
        events = head + tail
        assert [e.sequence_number for e in events] == list(range(len(events)))  # none lost, none repeated
        assert events[-1].type == "response.incomplete"
        final = c.responses.retrieve(rid)
        assert final.status == "incomplete" and final.usage.output_tokens == LONG
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == final.output_text
        assert "resuming after the restart" in srv.log_path.read_text()
        want = c.chat.completions.create(model="tiny", messages=PROMPT, max_tokens=LONG, temperature=0)
        assert final.output_text == want.choices[0].message.content  # as if it had never stopped
        assert wait_until(lambda: srv.status()["requests"]["running"] == 0, timeout=10)
        # A graceful stop (SIGTERM) leaves a running background response in progress rather than wait for it.
        r = c.responses.create(model="tiny", input=PROMPT, max_output_tokens=LONG, temperature=0, background=True)
        assert wait_until(lambda: _tokens(db, r.id) >= 20, timeout=60)
    finally:
        assert srv.stop() == 0
    assert 20 <= _tokens(db, r.id) < LONG
    srv = launch(lambda: responses_server(tmp_path, tiny_model))
    try:
        c = _client(srv)
        assert wait_until(lambda: c.responses.retrieve(r.id).status == "incomplete", timeout=120)
        assert c.responses.retrieve(r.id).usage.output_tokens == LONG
        assert c.responses.retrieve(r.id).output_text == want.choices[0].message.content
    finally:
        assert srv.stop() == 0

"""The Responses store: a key reads only its own responses, events come back after N exactly once, tokens and
events are recorded together, the store is bounded in count and age (running responses never pruned), and
ids are unguessable."""
from __future__ import annotations

import time

from mindie_service.serving.responses_service import new_response_id
from mindie_service.storage.responses_store import ResponsesStore


def _create(store: ResponsesStore, rid: str, owner: str = "", status: str = "completed", bg: bool = False) -> None:
    store.create(rid, owner, {"input": "x"}, [{"type": "message", "role": "user", "content": "ctx"}],
                 [{"type": "message", "role": "user", "content": "x", "id": "msg_1"}],
                 {"id": rid, "status": status, "output": [{"type": "message", "id": "msg_o"}]}, bg)


def test_a_key_never_reads_or_deletes_another_keys_response(tmp_path):
    s = ResponsesStore(tmp_path, 100, 3600)
    _create(s, "resp_a", owner="key-a")
    assert s.get("resp_a", "key-a") is not None
    assert s.get("resp_a", "key-b") is None and s.get("resp_a", "") is None
    assert not s.delete("resp_a", "key-b") and s.get("resp_a", "key-a") is not None
    assert s.delete("resp_a", "key-a") and s.get("resp_a", "key-a") is None


def test_conversation_is_context_input_then_output(tmp_path):
    s = ResponsesStore(tmp_path, 100, 3600)
    _create(s, "resp_a")
    assert [it.get("content", it.get("id")) for it in s.get("resp_a", "").conversation()] == ["ctx", "x", "msg_o"]


def test_events_after_n_come_once_in_order_and_tokens_with_them(tmp_path):
    s = ResponsesStore(tmp_path, 100, 3600)
    _create(s, "resp_a", status="in_progress", bg=True)
    s.record("resp_a", [], [{"type": "response.created", "sequence_number": 0}])
    s.record("resp_a", [(0, 7, "he", "")], [{"type": "d", "sequence_number": 1}, {"type": "d", "sequence_number": 2}],
             prompt={"ids": [1, 2], "input": 2, "cached": 0})
    s.record("resp_a", [(1, 8, "llo", "")], [{"type": "d", "sequence_number": 3}], {"id": "resp_a", "status": "completed"})
    assert [e["sequence_number"] for e in s.events("resp_a", -1)] == [0, 1, 2, 3]
    assert [e["sequence_number"] for e in s.events("resp_a", 1)] == [2, 3]
    assert s.events("resp_a", 3) == [] and s.last_seq("resp_a") == 3
    assert s.tokens("resp_a") == [(7, "he", ""), (8, "llo", "")]
    row = s.get("resp_a", "")
    assert row.status == "completed" and row.prompt == {"ids": [1, 2], "input": 2, "cached": 0}
    assert s.unfinished() == []


def test_the_store_survives_reopening(tmp_path):
    s = ResponsesStore(tmp_path, 100, 3600)
    _create(s, "resp_a", status="in_progress", bg=True)
    s.record("resp_a", [(0, 7, "he", "")], [{"type": "d", "sequence_number": 0}])
    s.close()
    s2 = ResponsesStore(tmp_path, 100, 3600)
    assert [r.id for r in s2.unfinished()] == ["resp_a"] and s2.tokens("resp_a") == [(7, "he", "")]


def test_count_bound_drops_the_oldest_finished_never_a_running_one(tmp_path):
    s = ResponsesStore(tmp_path, 3, 3600)
    _create(s, "resp_run", status="in_progress", bg=True)
    for i in range(5):
        _create(s, f"resp_{i}")
    kept = {r for r in ["resp_run", *[f"resp_{i}" for i in range(5)]] if s.get(r, "")}
    assert kept == {"resp_run", "resp_3", "resp_4"}


def test_age_bound_drops_finished_responses_past_it(tmp_path, monkeypatch):
    s = ResponsesStore(tmp_path, 100, 60)
    _create(s, "resp_old")
    _create(s, "resp_old_running", status="in_progress", bg=True)
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + 120)
    _create(s, "resp_new")
    assert s.get("resp_old", "") is None
    assert s.get("resp_old_running", "") is not None and s.get("resp_new", "") is not None


def test_ids_are_unguessable():
    ids = {new_response_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(i.startswith("resp_") and len(i) == 5 + 48 for i in ids)


def test_the_config_keys_bound_the_store(tmp_path):
    import pytest

    from mindie_service.config import load_config
    from mindie_service.errors import ConfigError
    from tests.server_utils import write_mock_config

    cfg = load_config(write_mock_config(tmp_path, responsesStore={"dir": "rs", "maxResponses": 5, "maxAgeHours": 2}))
    s = cfg.server
    assert (s.responses_dir, s.responses_max, s.responses_max_age) == (str(tmp_path / "rs"), 5, 7200.0)
    d = load_config(write_mock_config(tmp_path)).server
    assert (d.responses_dir, d.responses_max, d.responses_max_age) == (str(tmp_path / "responses"), 10000, 720 * 3600.0)
    with pytest.raises(ConfigError, match="maxResponses"):
        load_config(write_mock_config(tmp_path, responsesStore={"maxResponses": 0}))


def test_a_restart_takes_over_only_what_no_live_process_runs(tmp_path):
    import os
    import socket
    import subprocess
    import sys

    from mindie_service.serving.responses_lease import runner_dead

    s = ResponsesStore(tmp_path, 100, 3600)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    here = socket.gethostname()
    dead, alive, remote = f"{here}:{gone.stdout.strip()}:aa", f"{here}:{os.getppid()}:bb", "otherhost:1:cc"
    assert runner_dead(dead) and not runner_dead(alive) and not runner_dead(remote)
    for rid, runner in (("resp_dead", dead), ("resp_alive", alive), ("resp_remote", remote)):
        s.create(rid, "", {}, [], [], {"id": rid, "status": "in_progress"}, True, runner)
    now = time.time()
    assert s.claim("resp_dead", "me", now - 30, runner_dead)
    assert not s.claim("resp_alive", "me", now - 30, runner_dead)
    assert not s.claim("resp_remote", "me", now - 30, runner_dead)
    assert s.claim("resp_remote", "me", now + 1, runner_dead)  # silent for longer than the lease
    assert not s.claim("resp_remote", "other", now - 30, runner_dead)  # now ours, with a fresh beat


def test_a_record_never_overwrites_a_cancel(tmp_path):
    s = ResponsesStore(tmp_path, 100, 3600)
    _create(s, "resp_a", status="in_progress", bg=True)
    s.update("resp_a", {"id": "resp_a", "status": "cancelled"})
    s.record("resp_a", [(0, 5, "x", "")], [{"type": "d", "sequence_number": 0}], {"id": "resp_a", "status": "completed"})
    assert s.get("resp_a", "").status == "cancelled" and s.status("resp_a") == "cancelled"
    assert not s.claim("resp_a", "me", time.time(), lambda r: True)  # ended: nothing to take over


def test_a_resume_goes_on_before_the_tokens_whose_text_was_held_back(tmp_path):
    """Tokens that ended a cut response with half a UTF-8 character (empty deltas: no event yet) are made again by
    the resumed generation, which decodes its output apart from its prompt and would never complete those bytes; their
    rows go, so that the new ones are recorded once."""
    from mindie_service.serving.responses_service import held_back_dropped
    s = ResponsesStore(tmp_path, 100, 3600)
    _create(s, "resp_a", status="in_progress", bg=True)
    s.record("resp_a", [(0, 7, "he", ""), (1, 8, "", ""), (2, 9, "é", ""), (3, 10, "", ""), (4, 11, "", "")],
             [{"type": "d", "sequence_number": 0}, {"type": "d", "sequence_number": 1}])
    assert held_back_dropped(s, "resp_a") == [(7, "he", ""), (8, "", ""), (9, "é", "")]
    assert s.tokens("resp_a") == [(7, "he", ""), (8, "", ""), (9, "é", "")]
    s.record("resp_a", [(3, 10, "", ""), (4, 11, "x", "")], [{"type": "d", "sequence_number": 2}])  # made again: no clash
    assert held_back_dropped(s, "resp_a") == s.tokens("resp_a") and len(s.tokens("resp_a")) == 5


def test_thinking_deltas_are_recorded_and_a_token_with_only_thinking_text_is_kept(tmp_path):
    """A token whose text went to the reasoning item made events: a resume replays it (numbering), never drops it."""
    from mindie_service.serving.responses_service import held_back_dropped
    s = ResponsesStore(tmp_path, 100, 3600)
    _create(s, "resp_a", status="in_progress", bg=True)
    s.record("resp_a", [(0, 7, "", "hm"), (1, 8, "", ""), (2, 9, "", " ok"), (3, 10, "", "")],
             [{"type": "d", "sequence_number": 0}])
    assert held_back_dropped(s, "resp_a") == [(7, "", "hm"), (8, "", ""), (9, "", " ok")]


def test_a_store_written_before_thinking_was_recorded_opens_and_reads(tmp_path):
    import sqlite3
    db = sqlite3.connect(str(tmp_path / "responses.sqlite3"))
    db.executescript("CREATE TABLE response_tokens (id TEXT NOT NULL, n INTEGER NOT NULL, token INTEGER NOT NULL, "
                     "delta TEXT NOT NULL, PRIMARY KEY (id, n)); "
                     "INSERT INTO response_tokens VALUES ('resp_a', 0, 7, 'he');")
    db.commit()
    db.close()
    s = ResponsesStore(tmp_path, 100, 3600)
    assert s.tokens("resp_a") == [(7, "he", "")]

"""Stored chat completions (storage.chat_store): owner-scoped reads, OpenAI's list filters and pages, bounds, a
store that survives reopening (kill -9 leaves a completion whole or absent: one transaction per write)."""
from __future__ import annotations

import sqlite3
import time

import pytest

from mindie_service.storage.chat_store import ChatCompletionStore, ListQuery


def _put(s: ChatCompletionStore, cid: str, owner: str = "", model: str = "m", **meta: str) -> None:
    s.put(owner, {"id": cid, "object": "chat.completion", "model": model, "choices": []},
          [{"role": "user", "content": cid}], dict(meta))


def test_age_bound_drops_completions_past_it(tmp_path, monkeypatch):
    s = ChatCompletionStore(tmp_path, 100, 60)
    _put(s, "c_old")
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + 120)
    _put(s, "c_new")
    assert s.get("c_old", "") is None and s.get("c_new", "") is not None


def test_reads_are_the_owner_s_only(tmp_path):
    s = ChatCompletionStore(tmp_path, 100, 3600)
    _put(s, "c1", owner="a", k="v")
    assert s.get("c1", "a").json()["metadata"] == {"k": "v"} and s.get("c1", "b") is None
    assert s.set_metadata("c1", "b", {}) is None and not s.delete("c1", "b")
    assert s.list("b", ListQuery()) == ([], False)
    assert s.set_metadata("c1", "a", {"k": "w"}).metadata == {"k": "w"} and s.delete("c1", "a")


def test_list_filters_pages_and_orders(tmp_path):
    s = ChatCompletionStore(tmp_path, 100, 3600)
    for i in range(5):
        _put(s, f"c{i}", model="m" if i % 2 else "n", tag="odd" if i % 2 else "even")
    ids = lambda q: [r.id for r in s.list("", q)[0]]  # noqa: E731
    assert ids(ListQuery()) == ["c0", "c1", "c2", "c3", "c4"]
    assert ids(ListQuery(order="desc", limit=2)) == ["c4", "c3"] and s.list("", ListQuery(limit=2))[1]
    assert ids(ListQuery(after="c1", limit=2)) == ["c2", "c3"]
    assert ids(ListQuery(after="c3", order="desc")) == ["c2", "c1", "c0"]
    assert ids(ListQuery(model="m")) == ["c1", "c3"]
    assert ids(ListQuery(metadata=(("tag", "even"),))) == ["c0", "c2", "c4"]
    assert not s.list("", ListQuery(limit=5))[1]


def test_bounds_drop_the_oldest_and_ids_are_stored_once(tmp_path):
    s = ChatCompletionStore(tmp_path, 3, 3600)
    for i in range(5):
        _put(s, f"c{i}")
    assert [r.id for r in s.list("", ListQuery())[0]] == ["c2", "c3", "c4"]
    with pytest.raises(sqlite3.IntegrityError):
        _put(s, "c4")
    s.close()
    again = ChatCompletionStore(tmp_path, 3, 3600)
    assert again.get("c4", "").messages == [{"role": "user", "content": "c4"}]

"""Stored Responses (the OpenAI Responses API's ``store``) in SQLite (WAL), beside the batch jobs' store.

A row holds the request as sent (``body``), the conversation a ``previous_response_id`` prepended
(``context``), this call's input items, the latest response object, and its owner: the SHA-256 of the API
key that made it ("" when keys are off), so a key never reads another key's responses. A background
response also records each generated token (id and text delta) with the stream events it caused, in one
transaction: after ``kill -9`` the recorded tokens and events agree, so a restart resumes the generation from
its recorded tokens and the resumed stream continues the numbering with no event lost or repeated.

Bounded: at most ``max_responses`` rows and none older than ``max_age`` seconds once finished (pruned on each
insert, oldest first; a response still running is never pruned). Imports nothing of ours."""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from mindie_service.storage.sqlite_db import dumps as _dumps, open_db, prune

SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, created REAL NOT NULL, owner TEXT NOT NULL, status TEXT NOT NULL,
    background INTEGER NOT NULL, body TEXT NOT NULL, context TEXT NOT NULL, items TEXT NOT NULL,
    response TEXT NOT NULL, prompt TEXT, runner TEXT NOT NULL DEFAULT '', beat REAL NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS responses_created ON responses (created);
CREATE TABLE IF NOT EXISTS response_tokens (
    id TEXT NOT NULL, n INTEGER NOT NULL, token INTEGER NOT NULL, delta TEXT NOT NULL,
    thought TEXT NOT NULL DEFAULT '', PRIMARY KEY (id, n));
CREATE TABLE IF NOT EXISTS response_events (
    id TEXT NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL, PRIMARY KEY (id, seq));
"""
ACTIVE = ("queued", "in_progress")



@dataclass(frozen=True)
class StoredResponse:
    id: str
    created: float
    owner: str
    status: str
    background: bool
    body: dict[str, Any]
    context: list[dict[str, Any]]
    items: list[dict[str, Any]]
    response: dict[str, Any]
    prompt: dict[str, Any] | None  # {"ids": [...], "input": n, "cached": n} once the generation started

    def conversation(self) -> list[dict[str, Any]]:
        """The items a follow-up (``previous_response_id``) continues: context, input, then output."""
        return self.context + self.items + list(self.response.get("output") or [])


class ResponsesStore:
    def __init__(self, folder: str | os.PathLike[str], max_responses: int, max_age: float) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_responses, self.max_age = max_responses, max_age
        self._db = open_db(self.folder / "responses.sqlite3", SCHEMA)
        cols = {r[1] for r in self._db.execute("PRAGMA table_info(response_tokens)")}
        if "thought" not in cols:  # a store written before tokens kept their thinking text
            self._db.execute("ALTER TABLE response_tokens ADD COLUMN thought TEXT NOT NULL DEFAULT ''")
        self._lock = threading.Lock()

    def close(self) -> None:
        self._db.close()

    def _tx(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, args in statements:
                    self._db.execute(sql, args)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    # ------------------------------------------------------------ rows
    def create(self, rid: str, owner: str, body: dict[str, Any], context: list[dict[str, Any]],
               items: list[dict[str, Any]], response: dict[str, Any], background: bool, runner: str = "") -> None:
        """A new row; ``runner``: the process generating it (a background response's)."""
        self.prune()
        now = time.time()
        self._tx([("INSERT INTO responses (id, created, owner, status, background, body, context, items, response, "
                   "runner, beat) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   (rid, now, owner, response["status"], int(background), _dumps(body), _dumps(context),
                    _dumps(items), _dumps(response), runner, now))])

    def get(self, rid: str, owner: str) -> StoredResponse | None:
        """The row, only for its owner (another key's row is as absent as a missing one)."""
        with self._lock:
            r = self._db.execute(f"SELECT {_COLS} FROM responses WHERE id = ? AND owner = ?", (rid, owner)).fetchone()
        return _row(r) if r else None

    def get_any(self, rid: str) -> StoredResponse | None:
        """The row whoever owns it (the server's own resume and cancel, never a client's read)."""
        with self._lock:
            r = self._db.execute(f"SELECT {_COLS} FROM responses WHERE id = ?", (rid,)).fetchone()
        return _row(r) if r else None

    def delete(self, rid: str, owner: str) -> bool:
        with self._lock:
            n = self._db.execute("DELETE FROM responses WHERE id = ? AND owner = ?", (rid, owner)).rowcount
            if n:
                self._db.execute("DELETE FROM response_tokens WHERE id = ?", (rid,))
                self._db.execute("DELETE FROM response_events WHERE id = ?", (rid,))
        return bool(n)

    def update(self, rid: str, response: dict[str, Any], prompt: dict[str, Any] | None = None) -> None:
        """The response object (and its status); ``prompt``: the generation's prompt facts, once known."""
        sql = "UPDATE responses SET status = ?, response = ?" + (", prompt = ?" if prompt is not None else "")
        args: tuple[Any, ...] = (response["status"], _dumps(response))
        if prompt is not None:
            args += (_dumps(prompt),)
        self._tx([(sql + " WHERE id = ?", args + (rid,))])

    def unfinished(self) -> list[StoredResponse]:
        """Background responses a restart cut (queued or in progress), oldest first."""
        with self._lock:
            rows = self._db.execute(f"SELECT {_COLS} FROM responses WHERE background = 1 AND status IN (?, ?) "
                                    "ORDER BY created", ACTIVE).fetchall()
        return [_row(r) for r in rows]

    # ------------------------------------------------------------ a background response's tokens and events
    def record(self, rid: str, tokens: list[tuple[int, int, str, str]], events: list[dict[str, Any]],
               response: dict[str, Any] | None = None, prompt: dict[str, Any] | None = None) -> None:
        """``tokens`` ((n, id, answer delta, thinking delta) each) and the ``events`` they caused, in one transaction (with the
        response object when it changed, and the prompt's facts with the first token)."""
        st: list[tuple[str, tuple[Any, ...]]] = [
            ("INSERT INTO response_tokens (id, n, token, delta, thought) VALUES (?, ?, ?, ?, ?)", (rid, n, t, d, th))
            for n, t, d, th in tokens]
        st += [("INSERT INTO response_events (id, seq, body) VALUES (?, ?, ?)", (rid, e["sequence_number"], _dumps(e)))
               for e in events]
        st.append(("UPDATE responses SET beat = ? WHERE id = ?", (time.time(), rid)))
        if response is not None:  # never over a cancel (another replica's)
            st.append(("UPDATE responses SET status = ?, response = ? WHERE id = ? AND status != 'cancelled'",
                       (response["status"], _dumps(response), rid)))
        if prompt is not None:
            st.append(("UPDATE responses SET prompt = ? WHERE id = ?", (_dumps(prompt), rid)))
        self._tx(st)

    def status(self, rid: str) -> str | None:
        with self._lock:
            r = self._db.execute("SELECT status FROM responses WHERE id = ?", (rid,)).fetchone()
        return None if r is None else str(r[0])

    def claim(self, rid: str, runner: str, stale_before: float, dead: Callable[[str], bool]) -> bool:
        """Make ``runner`` the one generating ``rid`` (still queued or in progress) when its runner is none,
        ``dead``, or silent since ``stale_before``; False when another process runs it (or it ended)."""
        with self._lock:
            r = self._db.execute("SELECT runner, beat, status FROM responses WHERE id = ?", (rid,)).fetchone()
            if r is None or r[2] not in ACTIVE:
                return False
            old, beat = r[0], float(r[1])
            if old not in ("", runner) and beat >= stale_before and not dead(old):
                return False
            n = self._db.execute("UPDATE responses SET runner = ?, beat = ? WHERE id = ? AND runner = ?",
                                 (runner, time.time(), rid, old)).rowcount
        return n == 1

    def drop_tokens(self, rid: str, first: int) -> None:
        """Forget the recorded tokens from the ``first``-th on (they made no event: a resume makes them again)."""
        self._tx([("DELETE FROM response_tokens WHERE id = ? AND n >= ?", (rid, first))])

    def tokens(self, rid: str) -> list[tuple[int, str, str]]:
        """(id, answer delta, thinking delta) of each recorded token, in order."""
        with self._lock:
            rows = self._db.execute("SELECT token, delta, thought FROM response_tokens WHERE id = ? ORDER BY n",
                                    (rid,))
            return [(int(t), d, th) for t, d, th in rows]

    def events(self, rid: str, after: int, limit: int = 1000) -> list[dict[str, Any]]:
        """The recorded events numbered above ``after``, in order."""
        with self._lock:
            rows = self._db.execute("SELECT body FROM response_events WHERE id = ? AND seq > ? ORDER BY seq LIMIT ?",
                                    (rid, after, limit)).fetchall()
        return [json.loads(b) for (b,) in rows]

    def last_seq(self, rid: str) -> int:
        with self._lock:
            r = self._db.execute("SELECT MAX(seq) FROM response_events WHERE id = ?", (rid,)).fetchone()
        return -1 if r[0] is None else int(r[0])

    # ------------------------------------------------------------ bounds
    def prune(self) -> int:
        """Drop finished rows past ``max_age`` and, past ``max_responses``, the oldest finished ones."""
        with self._lock:  # room for the row about to come
            return prune(self._db, "responses", time.time() - self.max_age, self.max_responses, room=1,
                         keep="status IN (?, ?)", keep_args=ACTIVE, also=("response_tokens", "response_events"))


_COLS = "id, created, owner, status, background, body, context, items, response, prompt"


def _row(r: tuple[Any, ...]) -> StoredResponse:
    return StoredResponse(r[0], float(r[1]), r[2], r[3], bool(r[4]), json.loads(r[5]), json.loads(r[6]),
                          json.loads(r[7]), json.loads(r[8]), json.loads(r[9]) if r[9] else None)

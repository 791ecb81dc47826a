"""Stored chat completions (OpenAI's ``store: true`` on /v1/chat/completions) in SQLite, beside the responses.

A row holds the completion object as answered (streamed ones folded to the whole object), the request's
messages as sent, the call's metadata and its owner (the SHA-256 of the API key that made it, "" when keys are
off): a key never reads, lists, changes or deletes another key's completions. Bounded as the responses store is:
at most ``max_rows`` rows and none older than ``max_age`` seconds (pruned on each insert, oldest first). Each
write is one transaction: after ``kill -9`` a completion is stored whole or not at all. Imports nothing of ours
but the database opener."""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mindie_service.storage.sqlite_db import dumps as _dumps, open_db, prune

SCHEMA = """
CREATE TABLE IF NOT EXISTS chat_completions (
    id TEXT PRIMARY KEY, created REAL NOT NULL, owner TEXT NOT NULL, model TEXT NOT NULL,
    metadata TEXT NOT NULL, messages TEXT NOT NULL, completion TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS chat_completions_created ON chat_completions (created);
"""



@dataclass(frozen=True)
class StoredCompletion:
    id: str
    created: float
    model: str
    metadata: dict[str, str]
    messages: list[dict[str, Any]]
    completion: dict[str, Any]

    def json(self) -> dict[str, Any]:
        """The completion object as OpenAI's retrieve answers it: the answer, with its metadata."""
        return {**self.completion, "metadata": self.metadata}


@dataclass(frozen=True)
class ListQuery:
    """``GET /v1/chat/completions``'s filters and page: newest first unless ``order`` is asc."""

    model: str | None = None
    metadata: tuple[tuple[str, str], ...] = ()
    after: str | None = None
    limit: int = 20
    order: str = "asc"


class ChatCompletionStore:
    def __init__(self, folder: str | os.PathLike[str], max_rows: int, max_age: float) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_rows, self.max_age = max_rows, max_age
        self._db = open_db(self.folder / "chat_completions.sqlite3", SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        self._db.close()

    def put(self, owner: str, completion: dict[str, Any], messages: list[dict[str, Any]],
            metadata: dict[str, str]) -> None:
        """Store one completion (its ``id`` is the key; a second put of the same id is refused by the key)."""
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("INSERT INTO chat_completions VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 (completion["id"], now, owner, str(completion.get("model", "")), _dumps(metadata),
                                  _dumps(messages), _dumps(completion)))
                prune(self._db, "chat_completions", now - self.max_age, self.max_rows)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def get(self, cid: str, owner: str) -> StoredCompletion | None:
        with self._lock:
            r = self._db.execute("SELECT id, created, model, metadata, messages, completion FROM chat_completions "
                                 "WHERE id = ? AND owner = ?", (cid, owner)).fetchone()
        return None if r is None else _row(r)

    def set_metadata(self, cid: str, owner: str, metadata: dict[str, str]) -> StoredCompletion | None:
        with self._lock:
            n = self._db.execute("UPDATE chat_completions SET metadata = ? WHERE id = ? AND owner = ?",
                                 (_dumps(metadata), cid, owner)).rowcount
        return self.get(cid, owner) if n else None

    def delete(self, cid: str, owner: str) -> bool:
        with self._lock:
            return self._db.execute("DELETE FROM chat_completions WHERE id = ? AND owner = ?",
                                    (cid, owner)).rowcount == 1

    def list(self, owner: str, q: ListQuery) -> tuple[list[StoredCompletion], bool]:
        """One page of ``owner``'s completions matching ``q`` (metadata: every pair must match), and whether more
        follow. ``after``: a stored id (unknown: an empty page)."""
        sql = "SELECT id, created, model, metadata, messages, completion FROM chat_completions WHERE owner = ?"
        args: list[Any] = [owner]
        if q.model is not None:
            sql, args = sql + " AND model = ?", args + [q.model]
        for k, v in q.metadata:
            sql, args = sql + " AND json_extract(metadata, ?) = ?", args + [f'$."{k}"', v]
        asc = q.order == "asc"
        if q.after is not None:
            op = ">" if asc else "<"
            sql += f" AND (created, id) {op} (SELECT created, id FROM chat_completions WHERE id = ?)"
            args.append(q.after)
        sql += f" ORDER BY created {'ASC' if asc else 'DESC'}, id {'ASC' if asc else 'DESC'} LIMIT ?"
        args.append(q.limit + 1)
        with self._lock:
            rows = [_row(r) for r in self._db.execute(sql, args).fetchall()]
        return rows[:q.limit], len(rows) > q.limit


def _row(r: tuple[Any, ...]) -> StoredCompletion:
    return StoredCompletion(r[0], float(r[1]), r[2], json.loads(r[3]), json.loads(r[4]), json.loads(r[5]))

"""The one way the durable stores (batch jobs, responses, stored chat completions) open their SQLite file, and the
one way the bounded ones drop their old rows (``prune``)."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any


def open_db(path: Path, schema: str) -> sqlite3.Connection:
    """``path`` opened in autocommit mode for use from any thread (each store serializes its own calls), in WAL
    mode, with ``schema``'s tables made where missing."""
    db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")  # WAL: a commit survives a process kill
    db.executescript(schema)
    return db


def dumps(obj: Any) -> str:
    """A stored JSON value: compact, UTF-8 as it is, no NaN."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def prune(db: sqlite3.Connection, table: str, cut: float, max_rows: int, *, room: int = 0, keep: str = "",
          keep_args: tuple[Any, ...] = (), also: tuple[str, ...] = ()) -> int:
    """Drop ``table``'s rows (keyed by ``id``, dated by ``created``) made before ``cut``, then the oldest ones past
    ``max_rows`` less ``room`` (the rows about to be inserted), and the same ids' rows of each table in ``also``.
    Rows matching ``keep`` (an SQL condition over ``keep_args``: a response still running) are never dropped, but
    count against ``max_rows``. How many ids went. The caller serializes it (its lock, or its transaction)."""
    spare = f" AND NOT ({keep})" if keep else ""
    old = [r for (r,) in db.execute(f"SELECT id FROM {table} WHERE created < ?{spare}", (cut, *keep_args))]
    over = db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] - len(old) - max_rows + room
    if over > 0:
        old += [r for (r,) in db.execute(f"SELECT id FROM {table} WHERE created >= ?{spare} ORDER BY created LIMIT ?",
                                         (cut, *keep_args, over))]
    for rid in old:
        for t in (table, *also):
            db.execute(f"DELETE FROM {t} WHERE id = ?", (rid,))
    return len(old)

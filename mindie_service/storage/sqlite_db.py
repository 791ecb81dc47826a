"""The one way the durable stores (batch jobs, responses) open their SQLite file."""
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

"""Jobs and their records in SQLite (WAL), and the JSONL result files kept in step with it.

A record is committed to SQLite in the same transaction that marks its (line, generation) done and
advances the file's committed byte offset; only then is it appended to the JSONL file. On resume a
file is cut back to its committed records, and any committed record missing from it (the process
died between the commit and the append) is appended again from SQLite. So a reader sees progress
as it happens, and a record is written exactly once whatever moment the process is killed at.
The primary key (job, kind, line, generation) makes a second commit of the same record impossible."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from mindie_service.storage.sqlite_db import open_db

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY, created REAL NOT NULL, status TEXT NOT NULL, model TEXT NOT NULL,
    input_path TEXT NOT NULL, options TEXT NOT NULL, num_generations INTEGER NOT NULL,
    lines_total INTEGER NOT NULL DEFAULT 0, lines_failed INTEGER NOT NULL DEFAULT 0,
    generations_written INTEGER NOT NULL DEFAULT 0, tokens INTEGER NOT NULL DEFAULT 0,
    cancelled INTEGER NOT NULL DEFAULT 0, error TEXT,
    success_bytes INTEGER NOT NULL DEFAULT 0, error_bytes INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS records (
    job_id TEXT NOT NULL, kind TEXT NOT NULL, line INTEGER NOT NULL, generation INTEGER NOT NULL,
    start INTEGER NOT NULL, body TEXT NOT NULL, PRIMARY KEY (job_id, kind, line, generation));
"""
KINDS = ("success", "error")
ACTIVE = ("validating", "running")


@dataclass(frozen=True)
class JobRow:
    job_id: str
    created: float
    status: str
    model: str
    input_path: dict[str, str]
    options: dict[str, Any]
    num_generations: int
    lines_total: int
    lines_failed: int
    generations_written: int
    tokens: int
    cancelled: bool
    error: str | None

    @property
    def created_rfc3339(self) -> str:
        return datetime.fromtimestamp(self.created, timezone.utc).isoformat().replace("+00:00", "Z")


class JobStore:
    schema = SCHEMA  # a store built on this one (jobs.batch_store) adds its tables

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._db = open_db(self.folder / "jobs.sqlite3", self.schema)
        self._lock = threading.Lock()

    def close(self) -> None:
        self._db.close()

    # ------------------------------------------------------------ files
    def job_dir(self, job_id: str) -> Path:
        return self.folder / job_id

    def input_file(self, job_id: str) -> Path:
        return self.job_dir(job_id) / "input.jsonl"

    def result_file(self, job_id: str, kind: str) -> Path:
        return self.job_dir(job_id) / f"{kind}.jsonl"

    # ------------------------------------------------------------ jobs
    def create(self, model: str, input_path: dict[str, str], options: dict[str, Any], num_generations: int,
               data: bytes | Path, lines_total: int) -> str:
        """Store the input (its bytes, or a file copied in) and the job (status validating); on disk before this
        returns."""
        job_id = f"job-{uuid.uuid4().hex}"
        d = self.job_dir(job_id)
        d.mkdir(parents=True)
        tmp = d / "input.jsonl.part"
        if isinstance(data, Path):
            shutil.copyfile(data, tmp)
        else:
            tmp.write_bytes(data)
        os.replace(tmp, self.input_file(job_id))
        for kind in KINDS:
            self.result_file(job_id, kind).touch()
        with self._lock:
            self._db.execute(
                "INSERT INTO jobs (job_id, created, status, model, input_path, options, num_generations, lines_total)"
                " VALUES (?, ?, 'validating', ?, ?, ?, ?, ?)",
                (job_id, time.time(), model, json.dumps(input_path), json.dumps(options), num_generations,
                 lines_total))
        return job_id

    def get(self, job_id: str) -> JobRow | None:
        with self._lock:
            row = self._db.execute(f"SELECT {_COLS} FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return _row(row) if row else None

    def list(self, limit: int, offset: int) -> tuple[list[JobRow], int]:
        with self._lock:
            rows = self._db.execute(f"SELECT {_COLS} FROM jobs ORDER BY created DESC, job_id LIMIT ? OFFSET ?",
                                    (limit, offset)).fetchall()
            total = self._db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
        return [_row(r) for r in rows], int(total)

    def active(self) -> list[JobRow]:
        with self._lock:
            rows = self._db.execute(f"SELECT {_COLS} FROM jobs WHERE status IN ('validating', 'running') "
                                    "ORDER BY created").fetchall()
        return [_row(r) for r in rows]

    def set_status(self, job_id: str, status: str, error: str | None = None, cancelled: bool | None = None) -> None:
        with self._lock:
            self._db.execute("UPDATE jobs SET status = ?, error = COALESCE(?, error), "
                             "cancelled = COALESCE(?, cancelled) WHERE job_id = ?",
                             (status, error, None if cancelled is None else int(cancelled), job_id))

    # ------------------------------------------------------------ records
    def done(self, job_id: str) -> set[tuple[str, int, int]]:
        """(kind, line, generation) of every committed record."""
        with self._lock:
            rows = self._db.execute("SELECT kind, line, generation FROM records WHERE job_id = ?", (job_id,))
            return {(k, int(li), int(g)) for k, li, g in rows}

    def lines_done(self, job_id: str, num_generations: int) -> int:
        """Lines with nothing left to run: refused (one error record) or every generation recorded."""
        with self._lock:
            row = self._db.execute(
                "SELECT COUNT(*) FROM (SELECT line FROM records WHERE job_id = ? GROUP BY line "
                "HAVING MIN(generation) < 0 OR COUNT(*) >= ?)", (job_id, num_generations)).fetchone()
        return int(row[0])

    def commit(self, job_id: str, kind: str, line: int, generation: int, record: dict[str, Any],
               tokens: int = 0, failed_line: bool = False) -> bool:
        """Commit one record and append it to its file; False (nothing written) if it was committed before."""
        body = json.dumps(record, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n"
        data = body.encode("utf-8")
        col = f"{kind}_bytes"
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                start = self._db.execute(f"SELECT {col} FROM jobs WHERE job_id = ?", (job_id,)).fetchone()[0]
                self._db.execute("INSERT INTO records (job_id, kind, line, generation, start, body) "
                                 "VALUES (?, ?, ?, ?, ?, ?)", (job_id, kind, line, generation, start, body))
                self._db.execute(
                    f"UPDATE jobs SET {col} = {col} + ?, tokens = tokens + ?, "
                    "generations_written = generations_written + ?, lines_failed = lines_failed + ? WHERE job_id = ?",
                    (len(data), tokens, 1 if kind == "success" else 0, 1 if failed_line else 0, job_id))
                self._db.execute("COMMIT")
            except sqlite3.IntegrityError:
                self._db.execute("ROLLBACK")
                return False
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            # After the commit: a kill here leaves the file short, and reconcile() appends the record again.
            with open(self.result_file(job_id, kind), "ab") as f:
                f.seek(0, os.SEEK_END)
                if f.tell() == start:
                    f.write(data)
        return True

    def reconcile(self, job_id: str) -> None:
        """Make each result file hold exactly the committed records, in commit order (resume)."""
        with self._lock:
            for kind in KINDS:
                committed = self._db.execute(f"SELECT {kind}_bytes FROM jobs WHERE job_id = ?",
                                             (job_id,)).fetchone()[0]
                path = self.result_file(job_id, kind)
                size = path.stat().st_size if path.exists() else 0
                if size == committed:
                    continue
                # Keep the records wholly present, cut the rest, append what is missing.
                rows = self._db.execute("SELECT start, body FROM records WHERE job_id = ? AND kind = ? "
                                        "ORDER BY start", (job_id, kind)).fetchall()
                keep = 0
                for start, body in rows:
                    end = start + len(body.encode("utf-8"))
                    if end > size:
                        break
                    keep = end
                with open(path, "r+b" if path.exists() else "wb") as f:
                    f.truncate(keep)
                    f.seek(keep)
                    for start, body in rows:
                        if start >= keep:
                            f.write(body.encode("utf-8"))

    def read_results(self, job_id: str, kind: str, chunk: int = 1 << 16) -> Iterator[bytes]:
        """The committed bytes of a result file (never a record still being appended)."""
        job = self.get(job_id)
        with self._lock:
            limit = self._db.execute(f"SELECT {kind}_bytes FROM jobs WHERE job_id = ?", (job_id,)).fetchone()[0]
        left = int(limit) if job else 0
        with open(self.result_file(job_id, kind), "rb") as f:
            while left > 0:
                data = f.read(min(chunk, left))
                if not data:
                    return
                left -= len(data)
                yield data


_COLS = ("job_id, created, status, model, input_path, options, num_generations, lines_total, lines_failed, "
         "generations_written, tokens, cancelled, error")


def _row(r: tuple[Any, ...]) -> JobRow:
    return JobRow(r[0], float(r[1]), r[2], r[3], json.loads(r[4]), json.loads(r[5]), int(r[6]), int(r[7]), int(r[8]),
                  int(r[9]), int(r[10]), bool(r[11]), r[12])

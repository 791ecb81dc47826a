"""OpenAI Batches on the jobs store: a batch is a job (its input copied into the job's folder, each line's
record committed once: jobs.store) plus a row of OpenAI's facts (endpoint, window, metadata, status and its
timestamps, owner, the output files' ids) in the same SQLite file.

Status: validating -> in_progress -> finalizing -> completed; failed (validation refused the file); expired (the
completion window passed); cancelling -> cancelled. Each ``*_at`` is set once, when its status is first reached."""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mindie_service.jobs.store import SCHEMA as JOBS_SCHEMA
from mindie_service.jobs.store import JobStore

SCHEMA = JOBS_SCHEMA + """
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, job_id TEXT NOT NULL, owner TEXT NOT NULL,
    endpoint TEXT NOT NULL, input_file_id TEXT NOT NULL, completion_window TEXT NOT NULL, metadata TEXT,
    status TEXT NOT NULL, errors TEXT, output_file_id TEXT, error_file_id TEXT, total INTEGER NOT NULL,
    created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, in_progress_at INTEGER, finalizing_at INTEGER,
    completed_at INTEGER, failed_at INTEGER, expired_at INTEGER, cancelling_at INTEGER, cancelled_at INTEGER);
"""
STAMPS = ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")
RUNNING = ("validating", "in_progress", "finalizing", "cancelling")  # a restart carries these on


@dataclass(frozen=True)
class BatchRow:
    id: str
    job_id: str
    owner: str
    endpoint: str
    input_file_id: str
    completion_window: str
    metadata: dict[str, str] | None
    status: str
    errors: list[dict[str, Any]] | None
    output_file_id: str | None
    error_file_id: str | None
    total: int
    created_at: int
    expires_at: int
    stamps: dict[str, int | None]


_COLS = ("id, job_id, owner, endpoint, input_file_id, completion_window, metadata, status, errors, output_file_id, "
         "error_file_id, total, created_at, expires_at, " + ", ".join(f"{s}_at" for s in STAMPS))


def _row(r: tuple[Any, ...]) -> BatchRow:
    return BatchRow(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]) if r[6] else None, r[7],
                    json.loads(r[8]) if r[8] else None, r[9], r[10], int(r[11]), int(r[12]), int(r[13]),
                    dict(zip(STAMPS, r[14:])))


class BatchStore(JobStore):
    schema = SCHEMA

    def create_batch(self, owner: str, endpoint: str, input_file_id: str, window: str, window_s: float,
                     metadata: dict[str, str] | None, data: bytes | Path, total: int) -> BatchRow:
        """The batch, status validating, its input (bytes, or a file copied in) on disk, before this returns."""
        job_id = self.create("", {"value": input_file_id, "type": "file_id"}, {}, 1, data, total)
        bid, now = f"batch_{uuid.uuid4().hex}", int(time.time())
        with self._lock:
            self._db.execute(
                "INSERT INTO batches (id, job_id, owner, endpoint, input_file_id, completion_window, metadata, "
                "status, total, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, 'validating', ?, ?, ?)",
                (bid, job_id, owner, endpoint, input_file_id, window,
                 None if metadata is None else json.dumps(metadata), total, now, int(now + window_s)))
        b = self.batch(bid)
        assert b is not None
        return b

    def batch(self, bid: str, owner: str | None = None) -> BatchRow | None:
        """The batch; with ``owner``, only that owner's (another key's is as absent as a missing one)."""
        sql, args = f"SELECT {_COLS} FROM batches WHERE id = ?", [bid]
        if owner is not None:
            sql, args = sql + " AND owner = ?", args + [owner]
        with self._lock:
            r = self._db.execute(sql, args).fetchone()
        return _row(r) if r else None

    def batches(self, owner: str, after: str | None, limit: int) -> tuple[list[BatchRow], bool]:
        """A page of ``owner``'s batches, newest first, those after ``after``; and whether more follow."""
        sql, args = f"SELECT {_COLS} FROM batches WHERE owner = ?", [owner]
        with self._lock:
            if after is not None:
                cur = self._db.execute("SELECT seq FROM batches WHERE id = ? AND owner = ?", (after, owner)).fetchone()
                if cur is not None:
                    sql, args = sql + " AND seq < ?", args + [cur[0]]
            rows = self._db.execute(sql + " ORDER BY seq DESC LIMIT ?", (*args, limit + 1)).fetchall()
        return [_row(r) for r in rows[:limit]], len(rows) > limit

    def unfinished(self) -> list[BatchRow]:
        with self._lock:
            rows = self._db.execute(f"SELECT {_COLS} FROM batches WHERE status IN ({','.join('?' * len(RUNNING))}) "
                                    "ORDER BY seq", RUNNING).fetchall()
        return [_row(r) for r in rows]

    def set_batch(self, bid: str, status: str, *, only_from: tuple[str, ...] = (), **fields: Any) -> bool:
        """``status`` (its ``*_at`` stamped if not yet) and ``fields`` (errors, output_file_id, error_file_id);
        with ``only_from``, only while the status is one of them. False when nothing changed."""
        sets, args = ["status = ?"], [status]
        if status in STAMPS:
            sets.append(f"{status}_at = COALESCE({status}_at, ?)")
            args.append(int(time.time()))
        for k, v in fields.items():
            assert k in ("errors", "output_file_id", "error_file_id")
            sets.append(f"{k} = ?")
            args.append(json.dumps(v) if k == "errors" else v)
        sql = f"UPDATE batches SET {', '.join(sets)} WHERE id = ?"
        args.append(bid)
        if only_from:
            sql += f" AND status IN ({','.join('?' * len(only_from))})"
            args += list(only_from)
        with self._lock:
            return self._db.execute(sql, args).rowcount == 1

    def counts(self, job_id: str) -> tuple[int, int]:
        """(completed, failed): the lines recorded in the output file and in the error file."""
        with self._lock:
            rows = dict(self._db.execute("SELECT kind, COUNT(*) FROM records WHERE job_id = ? GROUP BY kind",
                                         (job_id,)).fetchall())
        return int(rows.get("success", 0)), int(rows.get("error", 0))

    def committed_bytes(self, job_id: str, kind: str) -> int:
        with self._lock:
            return int(self._db.execute(f"SELECT {kind}_bytes FROM jobs WHERE job_id = ?", (job_id,)).fetchone()[0])


def batch_json(b: BatchRow, counts: tuple[int, int]) -> dict[str, Any]:
    """OpenAI's Batch object."""
    out: dict[str, Any] = {
        "id": b.id, "object": "batch", "endpoint": b.endpoint,
        "errors": None if b.errors is None else {"object": "list", "data": b.errors},
        "input_file_id": b.input_file_id, "completion_window": b.completion_window, "status": b.status,
        "output_file_id": b.output_file_id, "error_file_id": b.error_file_id, "created_at": b.created_at,
        "expires_at": b.expires_at}
    out.update({f"{s}_at": v for s, v in b.stamps.items()})
    out["request_counts"] = {"total": b.total, "completed": counts[0], "failed": counts[1]}
    out["metadata"] = b.metadata
    return out

"""OpenAI Files (``/v1/files``): metadata in SQLite (WAL), each file's bytes in a file of its own.

A file's bytes are written under ``tmp/`` (an upload streams there as it arrives), flushed to disk, then renamed
to ``<id>`` (atomic), and only then is its row inserted: after ``kill -9`` a row always names whole bytes. A file
renamed whose row never came, and anything left under ``tmp/``, is removed when the store opens. A row belongs to
its owner: the SHA-256 of the API key that made it ("" when keys are off); another key's file is as absent as a
missing one. Quota: at most ``max_total_bytes`` of uploads per owner. Imports nothing of ours."""
from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from mindie_service.storage.sqlite_db import open_db

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, owner TEXT NOT NULL, purpose TEXT NOT NULL,
    filename TEXT NOT NULL, bytes INTEGER NOT NULL, created_at INTEGER NOT NULL);
"""
UPLOAD_PURPOSES = ("batch",)  # what a client may upload; batch_output is the server's own


@dataclass(frozen=True)
class FileRow:
    id: str
    owner: str
    purpose: str
    filename: str
    bytes: int
    created_at: int

    def to_json(self) -> dict[str, Any]:
        """OpenAI's File object."""
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed", "expires_at": None,
                "status_details": None}


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


def _sync_write_close(f: Any) -> None:
    f.flush()
    os.fsync(f.fileno())
    f.close()


class FilesStore:
    def __init__(self, folder: str | os.PathLike[str], max_file_bytes: int, max_total_bytes: int) -> None:
        self.folder = Path(folder)
        self.tmp = self.folder / "tmp"
        self.data = self.folder / "data"
        for d in (self.folder, self.tmp, self.data):
            d.mkdir(parents=True, exist_ok=True)
        self.max_file_bytes, self.max_total_bytes = max_file_bytes, max_total_bytes
        self._db = open_db(self.folder / "files.sqlite3", SCHEMA)
        self._lock = threading.Lock()
        self._sweep()

    def close(self) -> None:
        self._db.close()

    def _sweep(self) -> None:
        """Drop what a kill left: partial uploads, and bytes renamed whose row never came."""
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(exist_ok=True)
        with self._lock:
            known = {r for (r,) in self._db.execute("SELECT id FROM files")}
        for p in self.data.iterdir():
            if p.name not in known:
                p.unlink(missing_ok=True)

    def path(self, file_id: str) -> Path:
        return self.data / file_id

    def new_tmp(self) -> Path:
        """A fresh path under ``tmp/`` for an upload to stream into (``add`` moves it in)."""
        return self.tmp / f"{uuid.uuid4().hex}.part"

    def used(self, owner: str) -> int:
        with self._lock:
            r = self._db.execute("SELECT COALESCE(SUM(bytes), 0) FROM files WHERE owner = ? AND purpose IN "
                                 f"({','.join('?' * len(UPLOAD_PURPOSES))})", (owner, *UPLOAD_PURPOSES)).fetchone()
        return int(r[0])

    def add(self, tmp: Path, owner: str, purpose: str, filename: str, file_id: str | None = None) -> FileRow:
        """Move ``tmp`` (flushed to disk by its writer) in as a new file; ``file_id``: a fixed id (a batch's
        output, made again after a restart: the same id replaces nothing and adds no second row)."""
        fid = file_id or new_file_id()
        size = tmp.stat().st_size
        os.replace(tmp, self.path(fid))
        row = FileRow(fid, owner, purpose, filename, size, int(time.time()))
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO files (id, owner, purpose, filename, bytes, created_at) "
                             "VALUES (?, ?, ?, ?, ?, ?)", (fid, owner, purpose, filename, size, row.created_at))
        return self.get_any(fid) or row

    def copy_in(self, src: Path, limit: int, owner: str, purpose: str, filename: str, file_id: str) -> FileRow:
        """The first ``limit`` bytes of ``src`` as file ``file_id`` (idempotent: an existing row is kept)."""
        have = self.get_any(file_id)
        if have is not None:
            return have
        tmp = self.new_tmp()
        with open(src, "rb") as fin:
            fout = open(tmp, "wb")
            left = limit
            while left > 0:
                chunk = fin.read(min(1 << 20, left))
                if not chunk:
                    break
                fout.write(chunk)
                left -= len(chunk)
            _sync_write_close(fout)
        return self.add(tmp, owner, purpose, filename, file_id)

    def get(self, file_id: str, owner: str) -> FileRow | None:
        with self._lock:
            r = self._db.execute(f"SELECT {_COLS} FROM files WHERE id = ? AND owner = ?", (file_id, owner)).fetchone()
        return FileRow(*r) if r else None

    def get_any(self, file_id: str) -> FileRow | None:
        with self._lock:
            r = self._db.execute(f"SELECT {_COLS} FROM files WHERE id = ?", (file_id,)).fetchone()
        return FileRow(*r) if r else None

    def list(self, owner: str, purpose: str | None, after: str | None, limit: int,
             order: str) -> tuple[list[FileRow], bool]:
        """A page of ``owner``'s files (``order``: asc or desc by creation), those after the file ``after``;
        and whether more follow."""
        desc = order == "desc"
        sql = f"SELECT {_COLS} FROM files WHERE owner = ?"
        args: list[Any] = [owner]
        if purpose is not None:
            sql += " AND purpose = ?"
            args.append(purpose)
        with self._lock:
            if after is not None:
                cur = self._db.execute("SELECT seq FROM files WHERE id = ? AND owner = ?", (after, owner)).fetchone()
                if cur is not None:
                    sql += f" AND seq {'<' if desc else '>'} ?"
                    args.append(cur[0])
            sql += f" ORDER BY seq {'DESC' if desc else 'ASC'} LIMIT ?"
            rows = self._db.execute(sql, (*args, limit + 1)).fetchall()
        return [FileRow(*r) for r in rows[:limit]], len(rows) > limit

    def delete(self, file_id: str, owner: str) -> bool:
        with self._lock:
            n = self._db.execute("DELETE FROM files WHERE id = ? AND owner = ?", (file_id, owner)).rowcount
        if n:
            self.path(file_id).unlink(missing_ok=True)
        return bool(n)

    def read(self, file_id: str, chunk: int = 1 << 16) -> Iterator[bytes]:
        with open(self.path(file_id), "rb") as f:
            while True:
                data = f.read(chunk)
                if not data:
                    return
                yield data


_COLS = "id, owner, purpose, filename, bytes, created_at"

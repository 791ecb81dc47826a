"""Session files written off the engine thread. An eviction must copy the session's K/V before its blocks
are handed out (the engine thread does that: a memory copy), but the file write and its fsync can take
milliseconds to seconds on a busy disk, time every running request would wait for. One writer thread takes
the copies in order; until a file is on disk its bytes are served from memory (``pending``)."""
from __future__ import annotations

import logging
import os
import queue
import threading
from pathlib import Path

logger = logging.getLogger(__name__)


def write_atomic(path: Path, data: bytes) -> None:
    """``data`` into ``path``: a temporary file, flushed to disk, renamed over it."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class SpillWriter:
    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Path, bytes] | None] = queue.Queue()
        self._pending: dict[Path, bytes] = {}
        self._lock = threading.Lock()
        self.written = self.failed = 0
        self._thread = threading.Thread(target=self._run, name="session-spill-writer", daemon=True)
        self._thread.start()

    def submit(self, path: Path, data: bytes) -> None:
        with self._lock:
            self._pending[path] = data
        self._queue.put((path, data))

    def pending(self, path: Path) -> bytes | None:
        """The bytes queued for ``path`` and not yet on disk, else None."""
        with self._lock:
            return self._pending.get(path)

    def flush(self) -> None:
        """Wait until everything submitted so far is on disk (or failed, logged)."""
        self._queue.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                path, data = item
                try:
                    write_atomic(path, data)
                    self.written += 1
                except OSError as exc:
                    self.failed += 1
                    logger.warning("session file %s not written: %s", path.name, exc)
                with self._lock:
                    if self._pending.get(path) is data:
                        del self._pending[path]
            finally:
                self._queue.task_done()

"""A media item's raw bytes, in memory or on disk, so a large encoded video is never held in memory whole.

``Spooler`` takes a download (http body chunks, base64 blocks of a ``data:`` URI) and keeps it in memory up
to ``MediaPolicy.spool_bytes``; past that it moves to an unnamed temporary file (``tempfile.TemporaryFile``:
unlinked at creation, so even a crash leaves nothing on disk) and writes on from there. A local file is
already on disk: it is read through the descriptor that was opened and checked (never reopened by path, so
a swapped symlink cannot be read instead). PyAV decodes from ``MediaBytes.open()`` either way.

``MediaBytes.close()`` closes the descriptor (the temporary file's space goes back with it); the loader
calls it once decoding is over, on success, error or cancellation. ``SPOOL_STATS`` counts spooled files
open now and the most bytes a spooler held in memory, for the tests and the logs."""
from __future__ import annotations

import hashlib
import io
import logging
import os
import tempfile
import threading
from dataclasses import dataclass
from typing import BinaryIO

from .sniff import SNIFF_BYTES

logger = logging.getLogger(__name__)

_HASH_BLOCK = 1024 * 1024


@dataclass
class SpoolStats:
    files_open: int = 0  # spooled temporary files not closed yet
    files_total: int = 0  # spooled since start
    peak_memory: int = 0  # the most bytes one spooler held in memory


SPOOL_STATS = SpoolStats()
_stats_lock = threading.Lock()


class _FdReader(io.RawIOBase):
    """A seekable reader over a descriptor with its own position (os.pread): readers never share an offset."""

    def __init__(self, fd: int, size: int) -> None:
        super().__init__()
        self._fd, self._size, self._pos = fd, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        data = os.pread(self._fd, min(len(b), max(0, self._size - self._pos)), self._pos)
        b[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:  # the descriptor belongs to MediaBytes
        super().close()


class MediaBytes:
    """One media item's raw bytes: ``data`` in memory, or a descriptor (a spooled temporary file or a
    checked local file) of ``size`` bytes. Use as a context manager, or call ``close()``."""

    def __init__(self, data: bytes | None = None, *, fd: int | None = None, size: int | None = None,
                 sha256: str | None = None, spooled: bool = False) -> None:
        if (data is None) == (fd is None):
            raise ValueError("MediaBytes holds either data or a descriptor")
        self.data, self.fd, self.spooled = data, fd, spooled
        self.size = len(data) if data is not None else int(size or 0)
        self._sha256 = sha256
        self._lock = threading.Lock()
        self.head = data[:SNIFF_BYTES] if data is not None else os.pread(fd, SNIFF_BYTES, 0)  # type: ignore[arg-type]

    @property
    def on_disk(self) -> bool:
        return self.fd is not None

    def open(self) -> BinaryIO:
        """A fresh reader from the first byte (PyAV takes it as a file)."""
        if self.data is not None:
            return io.BytesIO(self.data)
        if self.fd is None:
            raise ValueError("the media bytes were closed")
        return io.BufferedReader(_FdReader(self.fd, self.size), buffer_size=_HASH_BLOCK)  # type: ignore[return-value]

    def sha256(self) -> str:
        if self._sha256 is None:
            if self.data is not None:
                self._sha256 = hashlib.sha256(self.data).hexdigest()
            else:
                h = hashlib.sha256()
                with self.open() as f:
                    while block := f.read(_HASH_BLOCK):
                        h.update(block)
                self._sha256 = h.hexdigest()
        return self._sha256

    def close(self) -> None:
        with self._lock:
            fd, self.fd = self.fd, None
        if fd is None:
            return
        os.close(fd)
        if self.spooled:
            with _stats_lock:
                SPOOL_STATS.files_open -= 1

    def __enter__(self) -> "MediaBytes":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # a path that forgot to close (a bug) still gives the space back
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class Spooler:
    """Collects a download: in memory up to ``threshold`` bytes (None: no limit), then in a temporary file
    in ``directory`` (None: the system's). ``finish()`` hands the bytes over; ``discard()`` drops them."""

    def __init__(self, threshold: int | None, directory: str | None = None) -> None:
        self.threshold, self.directory = threshold, directory
        self.buffer = bytearray()
        self.file: BinaryIO | None = None
        self.size = 0
        self._hash = hashlib.sha256()

    @property
    def held(self) -> int:
        """Bytes held in memory now."""
        return len(self.buffer)

    def head(self, n: int = SNIFF_BYTES) -> bytes:
        if self.file is None:
            return bytes(self.buffer[:n])
        return os.pread(self.file.fileno(), n, 0)

    def write(self, chunk: bytes) -> None:
        self._hash.update(chunk)
        self.size += len(chunk)
        if self.file is None and self.threshold is not None and len(self.buffer) + len(chunk) > self.threshold:
            self._to_disk()
        if self.file is not None:
            self.file.write(chunk)
            return
        self.buffer += chunk
        if len(self.buffer) > SPOOL_STATS.peak_memory:
            with _stats_lock:
                SPOOL_STATS.peak_memory = max(SPOOL_STATS.peak_memory, len(self.buffer))

    def _to_disk(self) -> None:
        self.file = tempfile.TemporaryFile(dir=self.directory)  # noqa: SIM115 - closed by finish/discard
        with _stats_lock:
            SPOOL_STATS.files_open += 1
            SPOOL_STATS.files_total += 1
        self.file.write(self.buffer)
        self.buffer = bytearray()
        logger.debug("spooling a download past %d bytes to a temporary file", self.threshold)

    def finish(self) -> MediaBytes:
        if self.file is None:
            data, self.buffer = bytes(self.buffer), bytearray()
            return MediaBytes(data, sha256=self._hash.hexdigest())
        self.file.flush()
        fd = os.dup(self.file.fileno())
        self.file.close()  # the dup keeps the unlinked file alive; MediaBytes owns it now
        self.file = None
        return MediaBytes(fd=fd, size=self.size, sha256=self._hash.hexdigest(), spooled=True)

    def discard(self) -> None:
        self.buffer = bytearray()
        if self.file is not None:
            self.file.close()
            self.file = None
            with _stats_lock:
                SPOOL_STATS.files_open -= 1

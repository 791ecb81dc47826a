"""Server-side paths behind their guard: lexical checks first (absolute, no ``..`` plain or
percent-encoded, no ``file://host/``), then the real path (symlinks resolved) must lie inside one of the
allowed folders, and a file is read only if it is a regular file (no device, FIFO or socket) under the cap,
through the descriptor that was opened and checked (``O_NOFOLLOW``, same inode as the checked path), so a
symlink swapped in between cannot be read instead."""
from __future__ import annotations

import os
import re
import stat
from urllib.parse import unquote, urlsplit

from mindie_service.errors import MediaError

from .guard_limits import PathLimits, mb

_READ_BLOCK = 1024 * 1024


def _has_dotdot(path: str) -> bool:
    return any(part == ".." for part in re.split(r"[/\\]", path))


def is_inside(path: str, root: str) -> bool:
    """True if ``path`` is ``root`` or lies under it (both already real paths)."""
    if path == root:
        return True
    prefix = root if root.endswith(os.sep) else root + os.sep
    return path.startswith(prefix)


def lexical_path(ref: str, is_file_uri: bool, limits: PathLimits, label: str) -> str:
    """The filesystem path ``ref`` (a path, or a ``file:`` URI) names, after the lexical checks. The folder
    check comes after the real path is known (``real_path_inside``)."""
    if not limits.roots:
        raise MediaError(f"{label}: server-local paths are not allowed (no allowed folder is set)", 403)
    raw = ref
    if is_file_uri:
        try:
            parts = urlsplit(ref)
        except ValueError:
            raise MediaError(f"{label}: the file URI is malformed", 422) from None
        if parts.netloc:
            raise MediaError(f"{label}: file URIs naming a host (file://host/...) are refused", 403)
        if parts.query or parts.fragment:
            raise MediaError(f"{label}: file URIs may not carry a query or fragment", 422)
        raw = parts.path
    if _has_dotdot(raw):
        raise MediaError(f"{label}: '..' path components are refused", 403)
    decoded = raw
    for _ in range(4):  # catches double encoding (%252e%252e) too
        nxt = unquote(decoded)
        if nxt == decoded:
            break
        decoded = nxt
    if _has_dotdot(decoded):
        raise MediaError(f"{label}: percent-encoded path traversal ('%2e%2e') is refused", 403)
    path = unquote(raw) if is_file_uri else raw
    if "\x00" in path:
        raise MediaError(f"{label}: the path contains a NUL character", 422)
    if not os.path.isabs(path):
        raise MediaError(f"{label}: a server-local path must be absolute", 422)
    return path


def real_path_inside(path: str, limits: PathLimits, label: str) -> str:
    """``path`` with symlinks resolved; 403 unless it lies inside one of the allowed folders."""
    real = os.path.realpath(path)
    if not any(is_inside(real, os.path.realpath(root)) for root in limits.roots):
        hint = f" ({limits.roots_hint})" if limits.roots_hint else ""
        raise MediaError(f"{label}: the path is outside the allowed folders{hint}", 403)
    return real


def open_regular(path: str, limits: PathLimits, label: str) -> tuple[int, int]:
    """Runs in a thread: real path inside the folders, stat, regular file, size cap, open (no symlink
    follow, no blocking on a FIFO), same-file check. Returns ``(descriptor, size)``; the caller closes it."""
    real = real_path_inside(path, limits, label)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise MediaError(f"{label}: file not found", 404) from None
    except OSError as e:
        raise MediaError(f"{label}: the file cannot be read ({e.strerror})", 403) from None
    if not stat.S_ISREG(st.st_mode):
        raise MediaError(f"{label}: not a regular file", 422)
    cap = limits.max_bytes
    if st.st_size > cap:
        raise MediaError(f"{label}: the file is {st.st_size} bytes, over the {limits.cap_name} cap of {mb(cap)}",
                         413)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(real, flags)
    except OSError as e:
        raise MediaError(f"{label}: the file cannot be read ({e.strerror})", 403) from None
    try:
        fst = os.fstat(fd)
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(fst.st_mode):
            raise MediaError(f"{label}: the file changed while it was being opened", 403)
    except BaseException:
        os.close(fd)
        raise
    return fd, fst.st_size


def read_fd(fd: int, limits: PathLimits, label: str) -> bytes:
    """Read an opened descriptor to its end, refusing it past the cap (a file may grow after its stat)."""
    cap = limits.max_bytes
    chunks: list[bytes] = []
    total = 0
    while True:
        block = os.read(fd, min(_READ_BLOCK, cap + 1 - total))
        if not block:
            break
        chunks.append(block)
        total += len(block)
        if total > cap:
            raise MediaError(f"{label}: the file is over the {limits.cap_name} cap of {mb(cap)}", 413)
    return b"".join(chunks)


def read_regular(path: str, limits: PathLimits, label: str) -> bytes:
    """Runs in a thread: ``open_regular`` then ``read_fd``; the whole file's bytes."""
    fd, _ = open_regular(path, limits, label)
    try:
        return read_fd(fd, limits, label)
    finally:
        os.close(fd)

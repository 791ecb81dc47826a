"""Media reference -> raw bytes, from one of three sources, each behind its own guard.

- server-local path (``/abs/path`` or ``file:///abs/path``): only inside the allowed folders
  after symlinks are resolved; ``..`` (plain or percent-encoded) and ``file://host/`` refused;
  size checked with stat before reading; read in a thread.
- ``data:`` URI (base64): size checked on the encoded length before decoding.
- http(s) URL: see ``netfetch`` (host allow-list, every resolved address checked, connection pinned
  to the checked address, no redirects, timeouts, byte cap while streaming).

The path and URL checks themselves are the guard's (``mindie_service.netguard``); this module picks the source and adds
what only media have (the per-request byte budget, the format sniff, spooling, ``data:`` URIs).

Every failure is a ``MediaError`` with a 4xx status whose message names the part:
403 refused source, 404 missing local file, 408 timed out, 413 over a cap, 415 unsupported
format, 422 anything else (malformed reference, upstream error)."""
from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import os
import re
from typing import Any, Callable

from mindie_service.errors import MediaError
from mindie_service.netguard import lexical_path, mb, open_regular, read_fd, refusal_reason

from .budget import ByteBudget
from .netfetch import fetch_url, http_get
from .policy import MediaKind, MediaPolicy, where
from .sniff import require_format
from .spool import MediaBytes, Spooler

logger = logging.getLogger(__name__)

__all__ = ["ByteBudget", "fetch_media", "http_get", "refusal_reason"]

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
# Data URIs above this many characters are decoded in a thread, not on the IO loop.
_INLINE_B64_CHARS = 256 * 1024
_B64_BLOCK_CHARS = 4 * 256 * 1024  # a multiple of 4: each block decodes alone (768 KB)

async def fetch_media(
    ref: str,
    kind: MediaKind,
    index: int,
    policy: MediaPolicy,
    *,
    budget: ByteBudget | None = None,
    spool: bool = False,
) -> Any:
    """The raw bytes ``ref`` names, checked against ``policy`` and sniffed to be an accepted
    format for ``kind``. Raises MediaError (4xx) naming ``inputs[index]``. ``spool``: a ``MediaBytes``
    (the caller closes it) in which a video over ``policy.spool_bytes`` stays on disk; else ``bytes``."""
    blob = await _fetch_media(ref, kind, index, policy, budget, spool)
    if spool:
        return blob
    with blob:
        return blob.data if blob.data is not None else blob.open().read()


async def _fetch_media(ref: str, kind: MediaKind, index: int, policy: MediaPolicy, budget: ByteBudget | None,
                       spool: bool) -> MediaBytes:
    w = where(index, kind)
    if not isinstance(ref, str) or not ref:
        raise MediaError(f"{w}: the reference must be a non-empty string", 422)
    if "\x00" in ref:
        raise MediaError(f"{w}: the reference contains a NUL character", 422)
    m = _SCHEME_RE.match(ref)
    scheme = m.group(1).lower() if m else None
    threshold = policy.spool_threshold(kind) if spool else None
    if scheme in ("http", "https"):
        data = await fetch_url(ref, kind, index, policy, budget)  # spools a video past policy.spool_bytes
    elif scheme == "data":
        data = await _decode_data_uri(ref, kind, index, policy, budget, threshold)
    elif scheme == "file" or scheme is None:
        data = await _read_local(ref, scheme == "file", kind, index, policy, budget, threshold)
    else:
        raise MediaError(
            f"{w}: unsupported source scheme {scheme!r} "
            "(use a server-local path, a data: URI or an http(s) URL)",
            422,
        )
    try:
        require_format(data.head, kind, index)
    except BaseException:
        data.close()
        raise
    return data


# ---------------------------------------------------------------------------------------------
# Local paths


def _read_local_file(path: str, kind: MediaKind, index: int, policy: MediaPolicy,
                     threshold: int | None = None) -> MediaBytes:
    """Runs in a thread: the guard's checked open (real path in the allowed folders, regular file, size cap,
    same file) and read. A file over ``threshold`` is not read: its checked descriptor is handed over
    (already on disk, never reopened)."""
    limits, w = policy.path_limits(kind), where(index, kind)
    fd, size = open_regular(path, limits, w)
    try:
        if threshold is not None and threshold < size <= limits.max_bytes:
            blob, fd = MediaBytes(fd=fd, size=size), -1  # the descriptor is the blob's now
            return blob
        return MediaBytes(read_fd(fd, limits, w))
    finally:
        if fd >= 0:
            os.close(fd)


async def _read_local(ref: str, is_file_uri: bool, kind: MediaKind, index: int,
                      policy: MediaPolicy, budget: ByteBudget | None, threshold: int | None = None) -> MediaBytes:
    path = lexical_path(ref, is_file_uri, policy.path_limits(kind), where(index, kind))
    loop = asyncio.get_running_loop()
    fut = loop.run_in_executor(None, _read_local_file, path, kind, index, policy, threshold)
    try:
        data = await asyncio.shield(fut)
    except asyncio.CancelledError:  # the read finishes in its thread: close what it hands over
        fut.add_done_callback(lambda f: f.cancelled() or f.exception() or f.result().close())
        raise
    try:
        if budget is not None:
            budget.take(data.size, index, kind)
    except BaseException:
        data.close()
        raise
    logger.debug("inputs[%d]: read %d bytes from a local file", index, data.size)
    return data


# ---------------------------------------------------------------------------------------------
# data: URIs


def _data_type_ok(mediatype: str, kind: MediaKind) -> bool:
    if kind == "image":
        return mediatype in ("image/jpeg", "image/jpg", "image/png")
    return mediatype.startswith(f"{kind}/") and len(mediatype) > len(kind) + 1


def _b64decode(payload: str) -> bytes:
    if len(payload) % 4:
        payload += "=" * (-len(payload) % 4)
    return base64.b64decode(payload, validate=True)


async def _decode_data_uri(ref: str, kind: MediaKind, index: int, policy: MediaPolicy,
                           budget: ByteBudget | None, threshold: int | None = None) -> MediaBytes:
    w = where(index, kind)
    header, sep, payload = ref[5:].partition(",")
    if not sep:
        raise MediaError(f"{w}: malformed data: URI (no ',' before the data)", 422)
    params = [p.strip().lower() for p in header.split(";")]
    mediatype, flags = params[0], params[1:]
    if "base64" not in flags:
        raise MediaError(f"{w}: a data: URI must be base64-encoded (';base64,')", 422)
    if not _data_type_ok(mediatype, kind):
        accepted = "image/jpeg or image/png" if kind == "image" else f"{kind}/*"
        raise MediaError(
            f"{w}: data: URI media type {mediatype or '(none)'!r} is not accepted here "
            f"(expected {accepted})",
            415,
        )
    cap = policy.max_bytes(kind)
    decoded_len = len(payload) * 3 // 4  # an upper bound, known before decoding anything
    if decoded_len > cap:
        raise MediaError(
            f"{w}: the base64 data decodes to about {decoded_len} bytes, over the {kind} cap "
            f"of {mb(cap)}",
            413,
        )
    if budget is not None:
        budget.take(decoded_len, index, kind)
    try:
        if threshold is not None and decoded_len > threshold:  # decoded block by block into a temporary file
            blob = await _in_thread(_b64decode_spooled, payload, threshold, policy.spool_dir)
        elif len(payload) > _INLINE_B64_CHARS:
            blob = MediaBytes(await _in_thread(_b64decode, payload))
        else:
            blob = MediaBytes(_b64decode(payload))
    except (binascii.Error, ValueError):
        raise MediaError(f"{w}: the data: URI is not valid base64", 422) from None
    if not blob.size:
        raise MediaError(f"{w}: the data: URI is empty", 422)
    return blob


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a thread; on cancellation a MediaBytes it still returns is closed."""
    fut = asyncio.get_running_loop().run_in_executor(None, fn, *args)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        fut.add_done_callback(lambda f: f.cancelled() or f.exception() or _close(f.result()))
        raise


def _close(result: Any) -> None:
    if isinstance(result, MediaBytes):
        result.close()


def _b64decode_spooled(payload: str, threshold: int, directory: str | None) -> MediaBytes:
    """Base64 decoded in blocks (each at most ``threshold`` bytes decoded) into a Spooler."""
    spool = Spooler(threshold, directory)
    step = max(4, min(_B64_BLOCK_CHARS, threshold // 3 * 4))  # a block decodes to at most the threshold
    try:
        for at in range(0, len(payload), step):
            block = payload[at:at + step]
            spool.write(_b64decode(block))
        return spool.finish()
    except BaseException:
        spool.discard()
        raise

"""MindIE list-form ``inputs`` -> validated parts -> fetched and decoded media.

``parse_parts`` checks the shape (no I/O); ``load_media`` fetches every media part concurrently
on the IO loop (sources.py guards) and decodes each in the given executor as soon as its bytes
arrive. Every model's processor goes through this one loader."""
from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Literal, Union

from mindie_service.errors import MediaError

from .decode import decode_audio, decode_image, decode_video
from .policy import MediaKind, MediaPolicy, where
from .sniff import sniff
from .sources import ByteBudget, fetch_media

logger = logging.getLogger(__name__)

PartKind = Literal["text", "image", "video", "audio"]

_MEDIA_TYPES: dict[str, MediaKind] = {
    "image_url": "image",
    "video_url": "video",
    "audio_url": "audio",
}
_TYPES = ("text", "image_url", "video_url", "audio_url")


@dataclass(frozen=True)
class TextPart:
    """A ``{"type": "text", "text": ...}`` element of ``inputs``."""

    index: int
    text: str
    kind: Literal["text"] = "text"


@dataclass(frozen=True)
class MediaItem:
    """A media element of ``inputs``: ``ref`` is a local path, ``file:///`` URI, data: URI or
    http(s) URL, not yet checked against the policy (fetch_media does that)."""

    index: int
    kind: MediaKind
    ref: str


Part = Union[TextPart, MediaItem]


@dataclass(frozen=True)
class DecodeOptions:
    """What the model's processor wants: frames sampled per video, audio sample rate."""

    num_video_frames: int = 8
    audio_sampling_rate: int = 16000

    def __post_init__(self) -> None:
        if self.num_video_frames <= 0:
            raise ValueError("DecodeOptions.num_video_frames must be positive")
        if self.audio_sampling_rate <= 0:
            raise ValueError("DecodeOptions.audio_sampling_rate must be positive")


@dataclass(frozen=True, eq=False)
class LoadedPart:
    """One element of ``inputs``, ready for a processor, in the original order.

    ``payload``: ``str`` (text), RGB ``PIL.Image.Image`` (image), ``list`` of H x W x 3 uint8
    ``numpy`` arrays (video), mono float32 ``numpy`` array at the requested rate (audio).
    ``sha256``: hex digest of the raw bytes (UTF-8 for text), for prefix-cache keys.
    ``format``: the sniffed container format (``png``, ``mp4``, ``wav``...), None for text.
    """

    index: int
    kind: PartKind
    payload: Any
    sha256: str
    format: str | None = None
    nbytes: int = 0


def parse_parts(inputs: Any, policy: MediaPolicy) -> list[Part]:
    """Validate MindIE's list form of ``inputs``. Accepts ``{"type": "image_url", "image_url":
    "..."}`` and OpenAI's ``{"type": "image_url", "image_url": {"url": "..."}}``. Raises
    MediaError (422) naming the element."""
    if not isinstance(inputs, list) or not inputs:
        raise MediaError("inputs must be a non-empty list of parts", 422)
    parts: list[Part] = []
    media_count = 0
    for i, element in enumerate(inputs):
        if not isinstance(element, dict):
            raise MediaError(f"inputs[{i}]: each part must be an object, got "
                             f"{type(element).__name__}", 422)
        part_type = element.get("type")
        if not isinstance(part_type, str) or part_type not in _TYPES:
            shown = part_type if isinstance(part_type, str) else repr(part_type)
            raise MediaError(
                f"inputs[{i}] ({shown}): unknown part type {shown!r} "
                f"(expected one of {', '.join(_TYPES)})", 422)
        if part_type == "text":
            text = element.get("text")
            if not isinstance(text, str):
                raise MediaError(f"{where(i, 'text')}: 'text' must be a string", 422)
            if not text:
                raise MediaError(f"{where(i, 'text')}: 'text' must not be empty", 422)
            parts.append(TextPart(i, text))
            continue
        kind = _MEDIA_TYPES[part_type]
        media_count += 1
        if media_count > policy.max_items:
            raise MediaError(
                f"{where(i, part_type)}: too many media items: at most {policy.max_items} "
                "image_url, video_url and audio_url parts per request", 422)
        value = element.get(part_type)
        if isinstance(value, dict):  # OpenAI form
            value = value.get("url")
        if not isinstance(value, str):
            raise MediaError(
                f"{where(i, part_type)}: {part_type!r} must be a string (a server-local path, a "
                f"data: URI or an http(s) URL), got {type(value).__name__}", 422)
        if not value.strip():
            raise MediaError(f"{where(i, part_type)}: {part_type!r} must not be empty", 422)
        parts.append(MediaItem(i, kind, value.strip()))
    return parts


def _decode_and_hash(data: bytes, item_kind: MediaKind, index: int, policy: MediaPolicy,
                     options: DecodeOptions) -> tuple[Any, str, str | None] | tuple[str, int]:
    """Executor side: decode and hash (hashing 512 MB takes a while too). A MediaError comes
    back as ``(message, status)``, so its status survives a process-pool round trip."""
    try:
        if item_kind == "image":
            payload = decode_image(data, index, policy)
        elif item_kind == "video":
            payload = decode_video(data, index, policy, options.num_video_frames)
        else:
            payload = decode_audio(data, index, policy, options.audio_sampling_rate)
    except MediaError as e:
        return e.message, e.status
    fmt = sniff(data)
    return payload, hashlib.sha256(data).hexdigest(), fmt.name if fmt else None


async def _load_one(item: MediaItem, policy: MediaPolicy, executor: Executor,
                    options: DecodeOptions, budget: ByteBudget) -> LoadedPart:
    data = await fetch_media(item.ref, item.kind, item.index, policy, budget=budget)
    loop = asyncio.get_running_loop()
    result = await loop.run_in_executor(
        executor,
        functools.partial(_decode_and_hash, data, item.kind, item.index, policy, options),
    )
    if len(result) == 2:
        message, status = result  # type: ignore[misc]
        raise MediaError(message, status)
    payload, digest, fmt = result  # type: ignore[misc]
    return LoadedPart(item.index, item.kind, payload, digest, fmt, len(data))


async def load_media(parts: Sequence[Part], policy: MediaPolicy, executor: Executor,
                     options: DecodeOptions | None = None) -> list[LoadedPart]:
    """Fetch all media parts concurrently, decode each in ``executor``; text parts pass
    through. Returns one LoadedPart per part, in order. On the first failure the other
    fetches are cancelled and the failure of the lowest-numbered part is raised."""
    options = options or DecodeOptions()
    budget = ByteBudget(policy.max_request_bytes)
    tasks: dict[int, asyncio.Task[LoadedPart]] = {}
    for part in parts:
        if isinstance(part, MediaItem):
            tasks[part.index] = asyncio.ensure_future(
                _load_one(part, policy, executor, options, budget))
    try:
        if tasks:
            done, pending = await asyncio.wait(tasks.values(),
                                               return_when=asyncio.FIRST_EXCEPTION)
            if pending:  # something failed
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
    except BaseException:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        raise
    failures = [(i, t.exception()) for i, t in sorted(tasks.items())
                if not t.cancelled() and t.exception() is not None]
    if failures:
        raise failures[0][1]  # type: ignore[misc]
    loaded: list[LoadedPart] = []
    for part in parts:
        if isinstance(part, TextPart):
            raw = part.text.encode("utf-8")
            loaded.append(LoadedPart(part.index, "text", part.text,
                                     hashlib.sha256(raw).hexdigest(), None, len(raw)))
        else:
            loaded.append(tasks[part.index].result())
    logger.debug("loaded %d media parts (%d bytes)", len(tasks), budget.used)
    return loaded

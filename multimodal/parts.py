"""The shape of MindIE's list-form ``inputs``: text and media parts, checked without any I/O.

Kept apart from ``loader`` so that the protocol layer can validate a request without importing the
decoders (PyAV, Pillow, soundfile) or Tornado's HTTP client."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Union

from mindie_service.errors import MediaError

from .policy import MediaKind, MediaPolicy, where

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

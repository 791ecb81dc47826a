"""Media layer: references in MindIE's list-form ``inputs`` -> guarded bytes -> decoded media.

    parts = parse_parts(inputs, policy)                        # shape only, no I/O
    loaded = await load_media(parts, policy, executor, DecodeOptions(num_video_frames=8))

Modules, one concern each: ``policy`` (limits), ``sources`` (local path / data: URI / http(s)
fetch with SSRF and size guards), ``sniff`` (format from magic bytes), ``decode`` (Pillow,
PyAV, soundfile with header checks first), ``loader`` (parse + concurrent load)."""
from __future__ import annotations

from .decode import decode_audio, decode_image, decode_video, sample_indices
from .loader import (
    DecodeOptions,
    LoadedPart,
    MediaItem,
    Part,
    TextPart,
    load_media,
    parse_parts,
)
from .policy import MEDIA_KINDS, MediaKind, MediaPolicy
from .sniff import MediaFormat, require_format, sniff
from .sources import ByteBudget, fetch_media, refusal_reason

__all__ = [
    "ByteBudget",
    "DecodeOptions",
    "LoadedPart",
    "MEDIA_KINDS",
    "MediaFormat",
    "MediaItem",
    "MediaKind",
    "MediaPolicy",
    "Part",
    "TextPart",
    "decode_audio",
    "decode_image",
    "decode_video",
    "fetch_media",
    "load_media",
    "parse_parts",
    "refusal_reason",
    "require_format",
    "sample_indices",
    "sniff",
]

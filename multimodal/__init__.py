"""Media layer: references in MindIE's list-form ``inputs`` -> guarded bytes -> decoded media.

    parts = parse_parts(inputs, policy)                        # shape only, no I/O
    loaded = await load_media(parts, policy, executor, DecodeOptions(num_video_frames=8))

Modules, one concern each: ``policy`` (limits), ``parts`` (the shape of ``inputs``), ``sources``
(local path / data: URI / http(s) URL; the path and URL guards are ``mindie_service.netguard``'s, called with the
policy's limits), ``netfetch`` (the guarded GET with the media's budget, sniff and spooling), ``sniff``
(format from magic bytes), ``decode`` (Pillow, PyAV, soundfile with header checks first), ``media_loader``
(concurrent load).

Names are resolved on first use (PEP 562), so validating a request (``parts``, ``policy``) never
imports PyAV, Pillow, soundfile or Tornado's HTTP client; only fetching and decoding do."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The light modules (stdlib + errors only) load at once; binding ``sniff`` here also keeps the
# function, not the submodule of the same name, as the package attribute.
from .parts import MediaItem, Part, TextPart, parse_parts
from .policy import MEDIA_KINDS, MediaKind, MediaPolicy
from .sniff import MediaFormat, require_format, sniff

if TYPE_CHECKING:
    from .decode import decode_audio, decode_image, decode_video, sample_indices
    from .media_loader import DecodeOptions, LoadedPart, load_media
    from .sources import ByteBudget, fetch_media, refusal_reason

# public name -> the heavy submodule that defines it (decoders, Tornado's HTTP client)
_LAZY: dict[str, str] = {
    **dict.fromkeys(("decode_audio", "decode_image", "decode_video", "sample_indices"), "decode"),
    **dict.fromkeys(("DecodeOptions", "LoadedPart", "load_media"), "media_loader"),
    **dict.fromkeys(("ByteBudget", "fetch_media", "refusal_reason"), "sources"),
}

__all__ = sorted([*_LAZY, "MEDIA_KINDS", "MediaFormat", "MediaItem", "MediaKind", "MediaPolicy", "Part", "TextPart",
                  "parse_parts", "require_format", "sniff"])


def __getattr__(name: str) -> Any:
    home = _LAZY.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

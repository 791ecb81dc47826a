"""What the media layer may fetch and decode: one frozen value object, built once from config.

Every limit the loader enforces lives here, so a request can never widen them. Where a fetch may go (allowed
folders and hosts, the private-address switch, URL length, timeouts) is the server's
``mindie_service.netguard.FetchPolicy``, held as ``fetch`` and shared with the catalog downloader and batch
jobs; the rest is the media's own. Defaults follow MindIE (20 media items, 4096-character URLs, image 20 MB,
video 512 MB, audio 20 MB, 5 s connect and 30 s read timeouts) plus the guards MindIE lacks (private-address
block, pixel / frame / duration caps, aspect-ratio and decoded-bytes caps, a per-request byte budget)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

from mindie_service.netguard import FetchPolicy, PathLimits, UrlLimits

logger = logging.getLogger(__name__)

MediaKind = Literal["image", "video", "audio"]
MEDIA_KINDS: tuple[MediaKind, ...] = ("image", "video", "audio")

MB = 1024 * 1024


@dataclass(frozen=True)
class MediaPolicy:
    """Limits for media parts, on top of ``fetch`` (where a fetch may go: see ``FetchPolicy``).

    - ``max_items``: media parts in one request; ``max_<kind>_bytes``: the raw bytes of one item of a kind.
    - ``max_request_bytes``: raw bytes all media of one request may take together.
    """

    fetch: FetchPolicy = field(default_factory=FetchPolicy)
    max_items: int = 20
    max_image_bytes: int = 20 * MB
    max_video_bytes: int = 512 * MB
    max_audio_bytes: int = 20 * MB
    max_request_bytes: int = 1024 * MB
    max_image_pixels: int = 40_000_000
    max_video_frames_total: int = 108_000
    max_video_seconds: float = 3600.0
    max_audio_seconds: float = 600.0
    max_audio_sample_rate: int = 384_000
    max_audio_channels: int = 64
    max_decoded_bytes: int = 256 * MB  # decoded bytes of all media of one request (ServerConfig.maxDecodedMediaBytes)
    max_aspect_ratio: float = 200.0  # long side / short side of an image or video frame
    max_video_frames_decoded: int = 2048  # frames decoded per video to reach the sampled ones
    # An encoded video larger than this is spooled to a temporary file while fetched (spool.py), never held
    # in memory whole; ``spool_dir`` None = the system's temporary folder.
    spool_bytes: int = 8 * MB
    spool_dir: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.fetch, FetchPolicy):
            raise TypeError(f"MediaPolicy.fetch must be a netguard FetchPolicy, got {type(self.fetch).__name__}")
        for name in (
            "max_items", "max_image_bytes", "max_video_bytes", "max_audio_bytes", "max_request_bytes",
            "max_image_pixels", "max_video_frames_total", "max_audio_sample_rate", "max_audio_channels",
            "max_decoded_bytes", "max_video_frames_decoded", "spool_bytes",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"MediaPolicy.{name} must be a positive integer, got {value!r}")
        for name in ("max_video_seconds", "max_audio_seconds", "max_aspect_ratio"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"MediaPolicy.{name} must be a positive number, got {value!r}")

    def max_bytes(self, kind: MediaKind) -> int:
        """The byte cap of one item of this kind."""
        if kind == "image":
            return self.max_image_bytes
        if kind == "video":
            return self.max_video_bytes
        if kind == "audio":
            return self.max_audio_bytes
        raise ValueError(f"unknown media kind {kind!r}")

    def spool_threshold(self, kind: MediaKind) -> int | None:
        """Bytes of an item of this kind held in memory before it goes to a temporary file (None: never)."""
        return self.spool_bytes if kind == "video" else None

    def url_limits(self, kind: MediaKind) -> UrlLimits:
        """The guard's limits for fetching one item of this kind over http(s)."""
        return self.fetch.url_limits(self.max_bytes(kind), kind)

    def path_limits(self, kind: MediaKind) -> PathLimits:
        """The guard's limits for reading one item of this kind from a server-local path."""
        return self.fetch.path_limits(self.max_bytes(kind), kind)


def where(index: int, kind: str) -> str:
    """How an error names a part: ``inputs[2] (image_url)``."""
    label = kind if kind == "text" or kind.endswith("_url") else f"{kind}_url"
    return f"inputs[{index}] ({label})"

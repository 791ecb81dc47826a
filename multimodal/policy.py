"""What the media layer may fetch and decode: one frozen value object, built once from config.

Every limit the loader enforces lives here, so a request can never widen them. Defaults follow
MindIE (20 media items, 4096-character URLs, image 20 MB, video 512 MB, audio 20 MB, 5 s connect
and 30 s read timeouts) plus the guards MindIE lacks (private-address block, pixel / frame /
duration caps, aspect-ratio and decoded-bytes caps, a per-request byte budget)."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Literal

from mindie_service.netguard import PathLimits, UrlLimits, host_allowed, normalize_hosts

logger = logging.getLogger(__name__)

MediaKind = Literal["image", "video", "audio"]
MEDIA_KINDS: tuple[MediaKind, ...] = ("image", "video", "audio")

MB = 1024 * 1024


@dataclass(frozen=True)
class MediaPolicy:
    """Limits and allow-lists for media parts.

    - ``allowed_local_paths``: folders a server-local path (or ``file:///`` URI) may point into,
      after symlinks are resolved. Empty: local paths are refused.
    - ``allow_private_urls``: let URLs reach loopback, private, link-local, multicast, reserved
      and cloud-metadata addresses. Off by default (server-side request forgery).
    - ``allowed_hosts``: if non-empty, the only URL hosts allowed. ``example.com`` matches that
      host exactly; ``.example.com`` or ``*.example.com`` match its subdomains.
    - ``connect_timeout``: seconds to resolve and connect. ``read_timeout``: seconds allowed for
      the response after that (the whole fetch must end within ``connect_timeout +
      read_timeout``, so a server trickling bytes cannot hold a request for long).
    - ``max_request_bytes``: raw bytes all media of one request may take together.
    """

    allowed_local_paths: tuple[str, ...] = ()
    allow_private_urls: bool = False
    allowed_hosts: tuple[str, ...] = ()
    max_items: int = 20
    max_url_len: int = 4096
    max_image_bytes: int = 20 * MB
    max_video_bytes: int = 512 * MB
    max_audio_bytes: int = 20 * MB
    max_request_bytes: int = 1024 * MB
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    max_response_headers: int = 100
    max_header_bytes: int = 64 * 1024
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
        paths = tuple(str(p) for p in self.allowed_local_paths)
        for p in paths:
            if not os.path.isabs(p):
                raise ValueError(f"MediaPolicy.allowed_local_paths must be absolute, got {p!r}")
        object.__setattr__(self, "allowed_local_paths", paths)
        object.__setattr__(self, "allowed_hosts", normalize_hosts(tuple(self.allowed_hosts)))
        for name in (
            "max_items", "max_url_len", "max_image_bytes", "max_video_bytes", "max_audio_bytes",
            "max_request_bytes", "max_response_headers", "max_header_bytes", "max_image_pixels",
            "max_video_frames_total", "max_audio_sample_rate", "max_audio_channels", "max_decoded_bytes",
            "max_video_frames_decoded", "spool_bytes",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"MediaPolicy.{name} must be a positive integer, got {value!r}")
        for name in ("connect_timeout", "read_timeout", "max_video_seconds", "max_audio_seconds",
                     "max_aspect_ratio"):
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

    def host_allowed(self, host: str) -> bool:
        """True if ``host`` (lower case, no trailing dot) passes the host allow-list."""
        return host_allowed(host, self.allowed_hosts)

    def url_limits(self, kind: MediaKind) -> UrlLimits:
        """The guard's limits for fetching one item of this kind over http(s)."""
        return self.fetch_limits(self.max_bytes(kind), kind)

    def fetch_limits(self, max_bytes: int, cap_name: str, read_timeout: float | None = None) -> UrlLimits:
        """The server's outbound rules (hosts, private addresses, URL length, timeouts, headers) with another
        caller's cap (a catalog download, a batch job's input file) and, if given, its read timeout."""
        return UrlLimits(max_bytes=max(max_bytes, 0), cap_name=cap_name, allowed_hosts=self.allowed_hosts,
                         allow_private=self.allow_private_urls, max_url_len=self.max_url_len,
                         connect_timeout=self.connect_timeout,
                         read_timeout=self.read_timeout if read_timeout is None else read_timeout,
                         max_response_headers=self.max_response_headers, max_header_bytes=self.max_header_bytes)

    def path_limits(self, kind: MediaKind) -> PathLimits:
        """The guard's limits for reading one item of this kind from a server-local path."""
        return PathLimits(roots=self.allowed_local_paths, max_bytes=self.max_bytes(kind), cap_name=kind)


def where(index: int, kind: str) -> str:
    """How an error names a part: ``inputs[2] (image_url)``."""
    label = kind if kind == "text" or kind.endswith("_url") else f"{kind}_url"
    return f"inputs[{index}] ({label})"

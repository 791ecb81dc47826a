"""The server's outbound rules, shared by every caller of the guard: one frozen value object, built once from
config (``ServerConfig.allowedLocalMediaPaths``, ``allowPrivateMediaUrls``, ``mediaUrlAllowedHosts``).

Media (``multimodal.MediaPolicy`` holds one), the catalog downloader and batch-job input files each turn it
into the ``UrlLimits`` / ``PathLimits`` of one fetch with their own byte cap, so they share the folders, hosts,
private-address switch and timeouts and no caller depends on another's policy."""
from __future__ import annotations

import os
from dataclasses import dataclass

from .guard_limits import PathLimits, UrlLimits, host_allowed, normalize_hosts


@dataclass(frozen=True)
class FetchPolicy:
    """Where a server-side fetch may go.

    - ``allowed_local_paths``: folders a server-local path (or ``file:///`` URI) may point into, after
      symlinks are resolved. Empty: local paths are refused.
    - ``allow_private_urls``: let URLs reach loopback, private, link-local, multicast, reserved and
      cloud-metadata addresses. Off by default (server-side request forgery).
    - ``allowed_hosts``: if non-empty, the only URL hosts allowed. ``example.com`` matches that host
      exactly; ``.example.com`` or ``*.example.com`` match its subdomains.
    - ``connect_timeout``: seconds to resolve and connect. ``read_timeout``: seconds allowed for the response
      after that (the whole fetch must end within ``connect_timeout + read_timeout``, so a server trickling
      bytes cannot hold a request for long); a caller may scale it for larger bodies.
    """

    allowed_local_paths: tuple[str, ...] = ()
    allow_private_urls: bool = False
    allowed_hosts: tuple[str, ...] = ()
    max_url_len: int = 4096
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    max_response_headers: int = 100
    max_header_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        paths = tuple(str(p) for p in self.allowed_local_paths)
        for p in paths:
            if not os.path.isabs(p):
                raise ValueError(f"FetchPolicy.allowed_local_paths must be absolute, got {p!r}")
        object.__setattr__(self, "allowed_local_paths", paths)
        object.__setattr__(self, "allowed_hosts", normalize_hosts(tuple(self.allowed_hosts)))
        for name in ("max_url_len", "max_response_headers", "max_header_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"FetchPolicy.{name} must be a positive integer, got {value!r}")
        for name in ("connect_timeout", "read_timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"FetchPolicy.{name} must be a positive number, got {value!r}")

    def host_allowed(self, host: str) -> bool:
        """True if ``host`` (lower case, no trailing dot) passes the host allow-list."""
        return host_allowed(host, self.allowed_hosts)

    def url_limits(self, max_bytes: int, cap_name: str, read_timeout: float | None = None) -> UrlLimits:
        """These rules (hosts, private addresses, URL length, timeouts, headers) with one caller's byte cap
        and, if given, its read timeout."""
        return UrlLimits(max_bytes=max(max_bytes, 0), cap_name=cap_name, allowed_hosts=self.allowed_hosts,
                         allow_private=self.allow_private_urls, max_url_len=self.max_url_len,
                         connect_timeout=self.connect_timeout,
                         read_timeout=self.read_timeout if read_timeout is None else read_timeout,
                         max_response_headers=self.max_response_headers, max_header_bytes=self.max_header_bytes)

    def path_limits(self, max_bytes: int, cap_name: str, roots_hint: str = "") -> PathLimits:
        """The allowed local folders with one caller's byte cap (``roots_hint``: see ``PathLimits``)."""
        return PathLimits(roots=self.allowed_local_paths, max_bytes=max_bytes, cap_name=cap_name,
                          roots_hint=roots_hint)

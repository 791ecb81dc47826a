"""What one caller of the guard allows: a frozen value object each for URLs and for server-side paths.

The guard has no defaults of its own that matter: media (``multimodal.MediaPolicy``), the catalog downloader
and batch-job input files each build the limits they need from the server's ``FetchPolicy``
(``fetch_policy.py``) and pass them on every call, so no request can widen them."""
from __future__ import annotations

import os
from dataclasses import dataclass

MB = 1024 * 1024
USER_AGENT = "mindie-service-media/0.1"


def mb(n: int) -> str:
    """A byte count as error messages show it: ``20 MB`` when whole, else ``1234 bytes``."""
    return f"{n // MB} MB" if n % MB == 0 else f"{n} bytes"


def normalize_hosts(hosts: tuple[str, ...]) -> tuple[str, ...]:
    """Allow-list entries in the form ``host_allowed`` compares: stripped, lower case, no trailing dot."""
    return tuple(h.strip().lower().rstrip(".") for h in hosts if h.strip())


def host_allowed(host: str, allowed_hosts: tuple[str, ...]) -> bool:
    """True if ``host`` passes the allow-list (empty: every host). ``example.com`` matches that host
    exactly; ``.example.com`` or ``*.example.com`` match its subdomains."""
    if not allowed_hosts:
        return True
    host = host.lower().rstrip(".")
    for entry in allowed_hosts:
        if entry.startswith("*."):
            entry = entry[1:]
        if entry.startswith("."):
            if host.endswith(entry) and len(host) > len(entry):
                return True
        elif host == entry:
            return True
    return False


@dataclass(frozen=True)
class UrlLimits:
    """One caller's rules for an http(s) fetch.

    - ``max_bytes``: the body cap, checked on Content-Length and while the body streams in; ``cap_name``
      names it in messages ("over the image cap of 20 MB").
    - ``allowed_hosts``: if non-empty, the only hosts (see ``host_allowed``).
    - ``allow_private``: let the host resolve to loopback, private, link-local, multicast, reserved and
      cloud-metadata addresses (off: server-side request forgery).
    - ``connect_timeout``: seconds to resolve and connect; the whole fetch must end within
      ``connect_timeout + read_timeout``.
    """

    max_bytes: int
    cap_name: str = "download"
    allowed_hosts: tuple[str, ...] = ()
    allow_private: bool = False
    max_url_len: int = 4096
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    max_response_headers: int = 100
    max_header_bytes: int = 64 * 1024
    user_agent: str = USER_AGENT

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_hosts", normalize_hosts(tuple(self.allowed_hosts)))
        for name in ("max_bytes", "max_url_len", "max_response_headers", "max_header_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"UrlLimits.{name} must be a non-negative integer, got {value!r}")
        for name in ("connect_timeout", "read_timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"UrlLimits.{name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class PathLimits:
    """One caller's rules for a server-side path: the folders it may point into after symlinks are resolved
    (empty: every path is refused), the byte cap of a file read through it and the cap's name in messages.
    ``roots_hint`` ends the "outside the allowed folders" message (e.g. the config key that sets them)."""

    roots: tuple[str, ...]
    max_bytes: int
    cap_name: str = "file"
    roots_hint: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "roots", tuple(os.path.abspath(str(r)) for r in self.roots))

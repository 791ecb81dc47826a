"""An http(s) URL checked before anything is fetched: shape (length, characters, ASCII), scheme, no
credentials, a host and a valid port, the host allow-list, then one DNS lookup with every address checked.
The result, a ``CheckedURL``, carries the addresses a guarded GET will connect to."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

from mindie_service.errors import MediaError

from .addresses import Address, resolve_checked
from .guard_limits import UrlLimits, host_allowed

logger = logging.getLogger(__name__)

SCHEMES = ("http", "https")


@dataclass(frozen=True)
class CheckedURL:
    """A URL that passed every check, with the only addresses it may be fetched from."""

    url: str
    host: str
    port: int
    addresses: tuple[Address, ...]


def url_host_port(ref: str, limits: UrlLimits, label: str) -> tuple[str, int]:
    """The lexical checks of ``ref`` (no I/O): its host and port. 422 for a malformed URL, 403 for a host
    outside the allow-list."""
    if len(ref) > limits.max_url_len:
        raise MediaError(f"{label}: the URL is {len(ref)} characters, over the limit of {limits.max_url_len}", 422)
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F or c == "\\" for c in ref):
        raise MediaError(f"{label}: the URL contains whitespace, control characters or '\\'", 422)
    if not ref.isascii():
        raise MediaError(f"{label}: the URL must be ASCII (percent-encode or punycode it)", 422)
    try:
        parts = urlsplit(ref)  # ValueError for a malformed IPv6 literal such as http://[::1/x.png
        host = parts.hostname
    except ValueError:
        raise MediaError(f"{label}: the URL is malformed (its host cannot be parsed)", 422) from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise MediaError(f"{label}: only http(s) URLs are fetched, not {scheme or 'a schemeless'!r} ones", 422)
    if "@" in parts.netloc:
        raise MediaError(f"{label}: credentials in URLs are not allowed", 422)
    if not host:
        raise MediaError(f"{label}: the URL has no host", 422)
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise MediaError(f"{label}: the URL has an invalid port", 422) from None
    if not host_allowed(host, limits.allowed_hosts):
        logger.info("%s: refused URL host not in the allow-list", label)
        raise MediaError(f"{label}: the URL host {host!r} is not in the allowed hosts", 403)
    return host, port


async def check_url(ref: str, limits: UrlLimits, label: str) -> CheckedURL:
    """``url_host_port``'s checks, then one DNS lookup with every address checked (``resolve_checked``)."""
    host, port = url_host_port(ref, limits, label)
    addresses = await resolve_checked(host, port, allow_private=limits.allow_private,
                                      timeout=limits.connect_timeout, label=label)
    return CheckedURL(ref, host, port, tuple(addresses))

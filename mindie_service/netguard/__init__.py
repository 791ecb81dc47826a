"""The one guard for every outbound fetch and every server-side path a request names.

    limits = UrlLimits(max_bytes=20 * MB, cap_name="image", allowed_hosts=(...), allow_private=False)
    target = await check_url(url, limits, label="inputs[0] (image_url)")   # shape, hosts, one checked lookup
    size = await pinned_get(target, limits, label, sink)                    # pinned connect, no redirects, caps

    plimits = PathLimits(roots=("/srv/media",), max_bytes=..., cap_name="image")
    path = lexical_path(ref, is_file_uri, plimits, label)                  # absolute, no '..', no file://host
    data = read_regular(path, plimits, label)                               # in a thread: realpath, regular file

The server's outbound rules (allowed folders and hosts, the private-address switch, timeouts) are one
``FetchPolicy``, built once from config; callers (``multimodal`` for media, ``mindie_service.catalog.download``
for weights, ``mindie_service.jobs`` for batch input files) each turn it into their own limits with their own
byte cap (``FetchPolicy.url_limits`` / ``path_limits``). Every refusal is a ``MediaError`` (a 4xx) whose message
starts with the caller's ``label``. Modules: ``fetch_policy`` (the shared rules), ``guard_limits`` (the
per-fetch value objects, host allow-list), ``addresses``
(the private-address block, one checked lookup), ``urls`` (URL checks), ``pinned_http`` (the guarded GET;
Tornado's HTTP client, so it loads on first use), ``paths`` (path checks and checked reads).

This package imports nothing of ``mindie_service`` but its errors (``.importlinter``: netguard-standalone)."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .addresses import METADATA_ADDRESSES, Address, refusal_reason, resolve_checked
from .fetch_policy import FetchPolicy
from .guard_limits import MB, USER_AGENT, PathLimits, UrlLimits, host_allowed, mb, normalize_hosts
from .paths import is_inside, lexical_path, open_regular, read_fd, read_regular, real_path_inside
from .urls import CheckedURL, check_url, url_host_port

if TYPE_CHECKING:
    from .pinned_http import BytesSink, PinnedResolver, Sink, pinned_get

_LAZY = {name: "pinned_http" for name in ("BytesSink", "PinnedResolver", "Sink", "pinned_get")}

__all__ = sorted([*_LAZY, "Address", "CheckedURL", "FetchPolicy", "MB", "METADATA_ADDRESSES", "PathLimits",
                  "USER_AGENT", "UrlLimits", "check_url", "host_allowed", "is_inside", "lexical_path", "mb",
                  "normalize_hosts", "open_regular", "read_fd", "read_regular", "real_path_inside", "refusal_reason",
                  "resolve_checked", "url_host_port"])


def __getattr__(name: str) -> Any:
    home = _LAZY.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

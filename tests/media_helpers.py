"""Helpers of the media source tests (tests/unit/test_media_sources.py, test_media_urls.py)."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from types import SimpleNamespace
from typing import Any

import pytest

from mindie_service.devkit import synth
from mindie_service.errors import MediaError
from mindie_service.netguard import PinnedResolver
from multimodal import MediaPolicy, fetch_media
from multimodal.netfetch import http_get

PNG = synth.image_bytes()
# The URL tests' handle on the media GET and the guard's pinned resolver, by the names they had when both
# lived in multimodal.netfetch (the guard is mindie_service.netguard now).
netfetch = SimpleNamespace(http_get=http_get, _PinnedResolver=PinnedResolver)


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


def fetch(ref: str, policy: MediaPolicy, kind: str = "image", index: int = 0) -> bytes:
    return run(fetch_media(ref, kind, index, policy))  # type: ignore[arg-type]


def refused(ref: str, policy: MediaPolicy, kind: str = "image", index: int = 0) -> MediaError:
    with pytest.raises(MediaError) as info:
        fetch(ref, policy, kind, index)
    err = info.value
    assert 400 <= err.status < 500
    assert f"inputs[{index}] ({kind}_url)" in err.message
    return err

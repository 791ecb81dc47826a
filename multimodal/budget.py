"""The raw bytes all media parts of one request may take together."""
from __future__ import annotations

from mindie_service.errors import MediaError

from .policy import MediaKind, where


def mb(n: int) -> str:
    mb = 1024 * 1024
    return f"{n // mb} MB" if n % mb == 0 else f"{n} bytes"


class ByteBudget:
    """Raw bytes all media parts of one request may take together (``max_request_bytes``).
    One per request; shared by its concurrent fetches (all on the IO loop thread)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int, index: int, kind: MediaKind) -> None:
        self.used += n
        if self.used > self.limit:
            raise MediaError(
                f"{where(index, kind)}: the request's media exceed the per-request total of "
                f"{mb(self.limit)}", 413)

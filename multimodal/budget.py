"""What all media parts of one request may take together: raw bytes (ByteBudget) and decoded bytes
(DecodedBudget)."""
from __future__ import annotations

import threading

from mindie_service.errors import MediaError
from mindie_service.netguard import mb

from .policy import MediaKind, where


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


class DecodedBudget:
    """Decoded bytes all media parts of one request may take together (``max_decoded_bytes``): pixels x 3
    per image or sampled video frame, 4 bytes per audio sample, and the processor's resized float image.
    Charged from the headers, before the decoding that would allocate them. Thread-safe: a request's
    items decode in the pool's threads at once."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self, n: int, index: int, kind: MediaKind, what: str) -> None:
        with self._lock:
            if self.used + n > self.limit:
                raise MediaError(
                    f"{where(index, kind)}: {what} would take {mb(n)} decoded; the request's media may take "
                    f"{mb(self.limit)} decoded in all (ServerConfig.maxDecodedMediaBytes), "
                    f"{mb(self.used)} already taken", 413)
            self.used += n

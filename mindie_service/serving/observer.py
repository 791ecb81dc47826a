"""What the serving core reports about requests: the small interface the metrics registry (server/metrics.py,
Prometheus) implements, so the core never imports a metrics library."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol


class RequestObserver(Protocol):
    def observe_received(self, n: int = 1) -> None:
        """``n`` generation requests arrived (an /api/generate-batch call counts one per prompt)."""

    def observe_request(self, *, ok: bool, e2e: float | None) -> None:
        """One generation request ended (``e2e`` only counts for a successful one)."""

    def observe_sequence(self, *, prompt_tokens: int, generated: int, ttft: float | None, e2e: float) -> None:
        """One engine sequence ended (a best_of request reports each of its sequences)."""


class NullObserver:
    """Observes nothing (the serving core without a metrics registry)."""

    def observe_received(self, n: int = 1) -> None:
        pass

    def observe_request(self, *, ok: bool, e2e: float | None) -> None:
        pass

    def observe_sequence(self, *, prompt_tokens: int, generated: int, ttft: float | None, e2e: float) -> None:
        pass


@dataclass
class RequestTally:
    """One call's requests, counted once each: received when the call starts (``count`` moves it to the number
    of prompts once parsed), ended with ``ok`` when the call ends (``with frontend.tally() as t: t.ok = ...``)."""

    observer: RequestObserver
    t0: float = field(default_factory=time.monotonic)
    n: int = 1
    ok: bool = False

    def __post_init__(self) -> None:
        self.observer.observe_received(self.n)

    def count(self, n: int) -> None:
        self.observer.observe_received(n - self.n)
        self.n = n

    def __enter__(self) -> "RequestTally":
        return self

    def __exit__(self, *exc: object) -> None:
        e2e = time.monotonic() - self.t0
        for _ in range(self.n):
            self.observer.observe_request(ok=self.ok, e2e=e2e)

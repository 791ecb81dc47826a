"""What the serving core reports about requests: the small interface the metrics registries (server/metrics.py,
MindIE's names; server/vllm_metrics.py, vLLM's) and the tracer (server/tracing.py) implement, so the core never
imports a metrics or tracing library."""
from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass, field
from typing import Mapping, Protocol

# The W3C trace context (traceparent, tracestate) of the request being served, set by its handler only while
# tracing is on; asyncio tasks started for the request inherit it, so the sequences' records carry it.
TRACE_HEADERS: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar("trace_headers",
                                                                                         default=None)


@dataclass(frozen=True)
class SequenceRecord:
    """One engine sequence, once it ended: its counts and its times on one monotonic clock (seconds). ``t0``: the
    call's start; ``first`` / ``last``: its first and last token's arrival; ``queued_at`` / ``scheduled_at``: the
    engine's (None where the engine does not tell them); ``gaps``: seconds between successive tokens;
    ``finish_reason``: vLLM's (stop, length, abort, error)."""

    request_id: str
    model: str
    prompt_tokens: int
    generated: int
    cached_tokens: int
    finish_reason: str
    t0: float
    end: float
    first: float | None = None
    last: float | None = None
    queued_at: float | None = None
    scheduled_at: float | None = None
    gaps: tuple[float, ...] = ()
    max_tokens: int | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    trace_headers: Mapping[str, str] | None = None


class RequestObserver(Protocol):
    def observe_received(self, n: int = 1) -> None:
        """``n`` generation requests arrived (an /api/generate-batch call counts one per prompt)."""

    def observe_request(self, *, ok: bool, e2e: float | None) -> None:
        """One generation request ended (``e2e`` only counts for a successful one)."""

    def observe_sequence(self, *, prompt_tokens: int, generated: int, ttft: float | None, e2e: float) -> None:
        """One engine sequence ended (a best_of request reports each of its sequences)."""

    def observe_record(self, rec: SequenceRecord) -> None:
        """The same sequence, in full (vLLM's metrics and the request spans read it)."""


class NullObserver:
    """Observes nothing (the serving core without a metrics registry)."""

    def observe_received(self, n: int = 1) -> None:
        pass

    def observe_request(self, *, ok: bool, e2e: float | None) -> None:
        pass

    def observe_sequence(self, *, prompt_tokens: int, generated: int, ttft: float | None, e2e: float) -> None:
        pass

    def observe_record(self, rec: SequenceRecord) -> None:
        pass


class ObserverGroup:
    """Several observers as one (MindIE's metrics, vLLM's, the tracer): each is told everything, in order."""

    def __init__(self, *members: RequestObserver) -> None:
        self.members = list(members)

    def observe_received(self, n: int = 1) -> None:
        for m in self.members:
            m.observe_received(n)

    def observe_request(self, *, ok: bool, e2e: float | None) -> None:
        for m in self.members:
            m.observe_request(ok=ok, e2e=e2e)

    def observe_sequence(self, *, prompt_tokens: int, generated: int, ttft: float | None, e2e: float) -> None:
        for m in self.members:
            m.observe_sequence(prompt_tokens=prompt_tokens, generated=generated, ttft=ttft, e2e=e2e)

    def observe_record(self, rec: SequenceRecord) -> None:
        for m in self.members:
            m.observe_record(rec)


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

"""One call's engine requests once admitted and prepared: n / best_of fan-out, each sample's events under
tokenTimeout and e2eTimeout, the samples merged as they come, and the one fold of events into a result
(``protocol.request.GenerationResult``).

Closing any of these iterators (finished, failed, cancelled, abandoned) closes the engine's, which aborts the
request and frees its KV blocks."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from contextlib import aclosing
from typing import Any, AsyncIterator

from mindie_service.engine.client import EngineClient
from mindie_service.engine.contract import EngineRequest, TokenEvent
from mindie_service.errors import GenerationError, MindieError, TimeoutError_
from mindie_service.protocol.request import GenerationResult
from mindie_service.serving.observer import TRACE_HEADERS, RequestObserver, SequenceRecord

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Timeouts:
    """ServerConfig.tokenTimeout (between two tokens) and e2eTimeout (the whole call, queueing included)."""

    token: float
    e2e: float
    e2e_name: str = "ServerConfig.e2eTimeout"  # what an e2e timeout message names (a request's own: its field)

    def capped(self, timeout: float | None, name: str) -> "Timeouts":
        """These limits under a request's own deadline ``timeout`` (MindIE /infer's ``timeout``), when sooner."""
        if timeout is None or timeout >= self.e2e:
            return self
        return Timeouts(token=min(self.token, timeout), e2e=timeout, e2e_name=name)


# Our finish reasons as vLLM's request_success_total labels them (FinishReason: stop, length, abort, error).
_VLLM_FINISH = {"length": "length", "eos_token": "stop", "stop_sequence": "stop"}


def fan_out(ereq: EngineRequest, index: int, best_of: int) -> EngineRequest:
    """Sample ``index`` of a best_of (OpenAI: ``n``) request: its own request id and its own params (a given
    seed moves by ``index`` so that the samples differ and each stays reproducible)."""
    if best_of == 1:
        return ereq
    p = ereq.params
    seed = None if p.seed is None else (p.seed + index) % (1 << 64)
    return dataclasses.replace(ereq, request_id=f"{ereq.request_id}.{index}",
                               params=dataclasses.replace(p, seed=seed))


async def fold(events: AsyncIterator[TokenEvent]) -> GenerationResult:
    """The one fold of a request's events into its result (closes ``events`` however it ends)."""
    result = GenerationResult()
    async with aclosing(events) as evs:
        async for ev in evs:
            result.add(ev)
    return result


@dataclasses.dataclass
class RunUsage:
    """A call's token counts and time to its first token (seconds from the call's start), for the access log."""

    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float | None = None


class _Track:
    """What one sequence's record needs, gathered as its events come (serving.observer.SequenceRecord)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.first: TokenEvent | None = None
        self.reason = "abort"  # ended without a finish reason: the client left, a timeout, the service stopped
        self.cached = 0

    def token(self, ev: TokenEvent) -> None:
        self.times.append(time.monotonic())
        if self.first is None:
            self.first, self.cached = ev, ev.num_cached_tokens
        if ev.finish_reason is not None:
            self.reason = _VLLM_FINISH.get(ev.finish_reason, "stop")

    def record(self, ereq: EngineRequest, model: str, prompt_n: int, t0: float, n: int) -> SequenceRecord:
        t, p, f = self.times, ereq.params, self.first
        return SequenceRecord(
            request_id=ereq.request_id, model=model, prompt_tokens=prompt_n, generated=len(t),
            cached_tokens=self.cached, finish_reason=self.reason, t0=t0, end=time.monotonic(),
            first=t[0] if t else None, last=t[-1] if t else None,
            queued_at=f.queued_at if f is not None else None, scheduled_at=f.scheduled_at if f is not None else None,
            gaps=tuple(b - a for a, b in zip(t, t[1:])), max_tokens=p.max_tokens, n=n,
            temperature=p.temperature, top_p=p.top_p, trace_headers=TRACE_HEADERS.get())


class Run:
    """The samples of one call on one engine (``Frontend.open`` yields it): ``events`` merges them,
    ``results`` folds each into a GenerationResult, ``text`` folds one sample's text."""

    def __init__(self, engine: EngineClient, requests: list[EngineRequest], best_of: int, t0: float,
                 timeouts: Timeouts, observer: RequestObserver) -> None:
        self.engine, self.requests, self.t0, self.best_of = engine, requests, t0, best_of
        self.samples = [fan_out(e, i, best_of) for e in requests for i in range(best_of)]
        self.timeouts, self.observer = timeouts, observer
        self.usage = RunUsage(prompt_tokens=sum(len(e.prompt_token_ids) for e in requests))
        self._waiting: set[asyncio.Task[Any]] = set()  # the tasks reading its samples' events (``cut``)
        self._cut: MindieError | None = None
        # when the call passed admission (Frontend.open) and was ready for the engine: the DEBUG phase line
        self.marks: dict[str, float] = {"ready": time.monotonic()}

    def cut(self, err: MindieError) -> None:
        """End every sample now with ``err`` (a stream's last frame says it): the service stops at once."""
        self._cut = err
        for task in list(self._waiting):
            task.cancel()

    async def results(self) -> list[GenerationResult]:
        """Every sample folded, in sample order (all run at once, so they share the engine's batches)."""
        tasks = [asyncio.ensure_future(self.fold(s)) for s in self.samples]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def fold(self, sample: EngineRequest) -> GenerationResult:
        return await fold(self.sample_events(sample))

    async def events(self) -> AsyncIterator[tuple[int, TokenEvent]]:
        """(sample index, event) of every sample, as they come; closing it aborts them all."""
        if len(self.samples) == 1:
            async with aclosing(self.sample_events(self.samples[0])) as events:
                async for ev in events:
                    yield 0, ev
            return
        queue: asyncio.Queue[tuple[int, TokenEvent | BaseException | None]] = asyncio.Queue()

        async def pump(k: int, ereq: EngineRequest) -> None:
            try:
                async with aclosing(self.sample_events(ereq)) as events:
                    async for ev in events:
                        queue.put_nowait((k, ev))
                queue.put_nowait((k, None))
            except Exception as e:
                queue.put_nowait((k, e))

        tasks = [asyncio.ensure_future(pump(k, s)) for k, s in enumerate(self.samples)]
        try:
            left = len(tasks)
            while left:
                k, item = await queue.get()
                if item is None:
                    left -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield k, item
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _next(self, agen: AsyncIterator[TokenEvent], timeout: float) -> TokenEvent:
        """The next event within ``timeout``; the Run's cut error once ``cut`` was called."""
        if self._cut is not None:
            raise self._cut
        task = asyncio.current_task()
        assert task is not None
        self._waiting.add(task)
        try:
            async with asyncio.timeout(timeout):
                return await anext(agen)
        except asyncio.CancelledError:
            if self._cut is None:
                raise
            task.uncancel()
            raise self._cut from None
        finally:
            self._waiting.discard(task)

    async def sample_events(self, ereq: EngineRequest) -> AsyncIterator[TokenEvent]:
        """The engine's events for ``ereq``, under tokenTimeout and e2eTimeout; each sequence is observed once."""
        to = self.timeouts
        loop = asyncio.get_running_loop()
        deadline = loop.time() - (time.monotonic() - self.t0) + to.e2e
        agen = self.engine.generate(ereq)
        first: float | None = None
        n, prompt_n = 0, len(ereq.prompt_token_ids)
        track = _Track()
        try:
            while True:
                left = deadline - loop.time()
                try:
                    ev = await self._next(agen, max(0.0, min(to.token, left)))
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    key, limit = ((to.e2e_name, to.e2e) if left <= to.token
                                  else ("ServerConfig.tokenTimeout", to.token))
                    raise TimeoutError_(f"generation timed out after {n} tokens ({key} = {limit:g} s)") from None
                except MindieError:
                    raise
                except Exception:  # the engine broke on this request: 424, the server goes on
                    logger.exception("%s: engine error", ereq.request_id)  # the details stay in the log
                    raise GenerationError(f"Request {ereq.request_id} failed during generation") from None
                if first is None:
                    first = time.monotonic()
                    prompt_n = ev.num_prompt_tokens or prompt_n
                n += 1
                track.token(ev)
                yield ev
                if ev.finish_reason is not None:
                    return
        except GenerationError:
            track.reason = "error"
            raise
        finally:
            await agen.aclose()
            ttft = None if first is None else first - self.t0
            self.usage.output_tokens += n
            if ttft is not None and (self.usage.ttft is None or ttft < self.usage.ttft):
                self.usage.ttft = ttft
            self.observer.observe_sequence(prompt_tokens=prompt_n, generated=n, ttft=ttft,
                                           e2e=time.monotonic() - self.t0)
            rec = track.record(ereq, getattr(self.engine, "model_name", ""), prompt_n, self.t0, self.best_of)
            self.observer.observe_record(rec)
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("%s", phase_line(rec, ereq.rank, self.marks))


def phase_line(rec: SequenceRecord, rank: int, marks: dict[str, float]) -> str:
    """Where a sequence's time to first token went, in ms from the call's start (tools/bench_priority.py --phases
    reads it): body read and parse plus the admission queue (``admitted``), tokenization (``ready``: its engine
    request handed over), the engine thread taking it in (``queued``: the step in flight ended), its first
    scheduling (``scheduled``), its first token on the IO loop (``first``)."""
    def ms(t: float | None) -> str:
        return "-" if t is None else f"{(t - rec.t0) * 1e3:.2f}"
    return (f"phases {rec.request_id} rank={rank} admitted={ms(marks.get('admitted'))} ready={ms(marks.get('ready'))} "
            f"queued={ms(rec.queued_at)} scheduled={ms(rec.scheduled_at)} first={ms(rec.first)}")

"""The serving core: one request path apart from HTTP, for every API family, batch jobs aside.

    frontend.tally()            the request metrics (received, then ended ok or not)
    frontend.open(submission)   admission (maxLinkNum), session keys claimed (409 on a busy one), the prompts
                                through the engine's input processor (tokenizer pool; media in a pool of its own)
      -> Run                    n / best_of fan-out, token/e2e timeouts, events merged or folded (streams.py)

A caller that goes away cancels the task awaiting any of these: it leaves the admission queue, its queued
tokenizer job never runs, and its engine requests are aborted."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterable, Iterator, Sequence

from mindie_service.engine.client import EngineClient
from mindie_service.engine.contract import PRIORITY_BATCH, EngineRequest, check_task
from mindie_service.errors import ConflictError, MindieError, TimeoutError_
from mindie_service.inputs.processor import InputProcessor
from mindie_service.inputs.types import Prompt
from mindie_service.sampling_params import SamplingParams
from mindie_service.serving.admission_queue import AdmissionQueue
from mindie_service.serving.observer import NullObserver, RequestObserver, RequestTally
from mindie_service.serving.streams import Run, Timeouts
from multimodal import MediaPolicy

logger = logging.getLogger(__name__)

# A batch line waits behind online traffic for as long as it must: its bound is the batch's completion window.
BATCH_TIMEOUTS = Timeouts(token=365 * 86400.0, e2e=365 * 86400.0, e2e_name="the batch's completion_window")


@dataclass(frozen=True)
class Submission:
    """One call, API-neutral: its prompts (one engine request each), their params and ids. ``engine`` is
    resolved once admitted (503 then if the model stopped while the call queued). ``session_ids``: the
    /api/* keys, one per prompt (claimed for the call; a kept session continues). ``slots``: admission
    slots the call takes (an /api/generate-batch call, one per prompt; other calls 1)."""

    prompts: Sequence[Prompt]
    params: SamplingParams
    engine: Callable[[], EngineClient]
    request_ids: Sequence[str]
    truncate: int | None = None
    best_of: int = 1
    session_ids: Sequence[str | None] = ()
    slots: int = 1
    timeout: float | None = None  # the call's own deadline in seconds (MindIE /infer), when sooner than e2eTimeout
    rank: int = 0  # its request priority in the scheduler, lower first (EngineRequest.rank: vLLM's convention)
    batch: bool = False  # a batch line (jobs.batch_runner): below online traffic, no admission slot, no timeouts


@dataclass
class SessionClaims:
    """The /api/* keys being generated: at most one request runs per key (a second is a 409)."""

    active: set[str] = field(default_factory=set)

    @contextlib.contextmanager
    def claim(self, ids: Iterable[str]) -> Iterator[None]:
        keys = list(ids)
        busy = [i for i in keys if i in self.active]
        if busy:
            raise ConflictError(f"request_id {busy[0]!r} is already being generated; wait for it to finish")
        self.active.update(keys)
        try:
            yield
        finally:
            self.active.difference_update(keys)


class Frontend:
    """One per process. ``gate`` raises (503) while the service takes no generation (loading, draining)."""

    def __init__(self, timeouts: Timeouts, max_running: int, workers: int, media_policy: MediaPolicy, *,
                 observer: RequestObserver | None = None, gate: Callable[[], None] = lambda: None) -> None:
        self.timeouts, self.media_policy, self.gate = timeouts, media_policy, gate
        self.observer: RequestObserver = observer or NullObserver()
        # MindIE's admission rule: maxLinkNum run, 2 x maxLinkNum wait (admission_queue.py).
        self.admission = AdmissionQueue(max_running)
        self.sessions = SessionClaims()
        # tokenizerProcessNumber sizes a thread pool, not processes: tokenizers releases the GIL, so threads
        # tokenize in parallel without pickling the tokenizer or the prompts. Body parsing runs there too.
        self.workers = max(1, workers)
        self.executor: ThreadPoolExecutor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="tokenize")
        # Media fetching and decoding have a pool of their own, of the same size: a request's images never hold
        # the tokenizer pool that a concurrent text request waits for (bytes bounded by maxDecodedMediaBytes).
        self.media_executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="media")
        self._processors: weakref.WeakKeyDictionary[Any, InputProcessor] = weakref.WeakKeyDictionary()
        self.runs: set[Run] = set()  # the calls under way (``cut_all``)

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.media_executor.shutdown(wait=False, cancel_futures=True)

    # -- input processing ----------------------------------------------------------------------------
    def processor(self, engine: EngineClient) -> InputProcessor:
        """``engine``'s input processor, built once from its ``input_facts`` and kept while the engine lives
        (the facts never refer to the engine client itself, so a stopped model's memory is freed)."""
        proc = self._processors.get(engine)
        if proc is None:
            proc = self._processors[engine] = InputProcessor.from_facts(engine.input_facts)
        return proc

    async def run_blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run parsing, tokenization (and other CPU work) in the tokenizer pool, off the IO loop."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def engine_request(self, engine: EngineClient, prompt: Prompt, params: SamplingParams, request_id: str, *,
                             truncate: int | None = None, session_id: str | None = None) -> EngineRequest:
        """The engine's request for ``prompt``: media fetched and decoded (media pool, guarded by the media
        policy), the prompt built, tokenized and checked (tokenizer pool). ``session_id``: the client's key;
        an engine that keeps sessions continues the one it names, if any."""
        return await self.processor(engine).process_async(
            prompt, params, request_id=request_id, truncate=truncate, executor=self.executor,
            media_policy=self.media_policy, session_id=session_id, media_executor=self.media_executor)

    # -- admission -----------------------------------------------------------------------------------
    async def admit(self, n: int = 1, timeout: float | None = None, limits: Timeouts | None = None,
                    rank: int = 0) -> None:
        """Take ``n`` admission slots, waiting in the queue (at priority ``rank``) for at most ``timeout`` seconds
        (what is left of e2eTimeout); 503 (gate) while loading/draining, 429 when the queue is full, 504 when the wait
        outlasts the timeout. ``release(n)`` after."""
        self.gate()
        try:
            await self.admission.acquire(n, timeout, rank)
        except TimeoutError:
            raise TimeoutError_(f"the request waited {timeout:.3g} s in the admission queue without a free slot "
                                f"({(limits or self.timeouts).e2e_name} = {(limits or self.timeouts).e2e:g} s, maxLinkNum = "
                                f"{self.admission.max_running})") from None

    def release(self, n: int = 1) -> None:
        self.admission.release(n)

    @contextlib.asynccontextmanager
    async def admitted(self, n: int, t0: float, limits: Timeouts | None = None, rank: int = 0) -> AsyncIterator[None]:
        """Hold ``n`` slots for the block; time in the queue counts against e2eTimeout (or ``limits``)."""
        to = limits or self.timeouts
        await self.admit(n, timeout=to.e2e - (time.monotonic() - t0), limits=to, rank=rank)
        try:
            yield
        finally:
            self.release(n)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no generation request is admitted or queued; False if ``timeout`` passed first."""
        try:
            await asyncio.wait_for(self.admission.idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    # -- one call ------------------------------------------------------------------------------------
    def tally(self, n: int = 1) -> RequestTally:
        return RequestTally(self.observer, n=n)

    @contextlib.asynccontextmanager
    async def open(self, sub: Submission, t0: float) -> AsyncIterator[Run]:
        """Admitted, keys claimed, engine requests prepared: the call's Run (slots and keys held while open).
        A ``batch`` submission takes no admission slot (the batch runner bounds its lines, ServerConfig.
        batchMaxRunning) and runs at batch priority, unobserved by the online request metrics."""
        limits = BATCH_TIMEOUTS if sub.batch else self.timeouts.capped(sub.timeout, "parameters.timeout")
        gate = contextlib.nullcontext() if sub.batch else self.admitted(sub.slots, t0, limits, sub.rank)
        async with gate:
            admitted = time.monotonic()
            with self.sessions.claim(k for k in sub.session_ids if k is not None):
                engine = sub.engine()
                check_task(engine.tasks, "generate", engine.model_name)  # an embedding or rerank model: 400
                keys = list(sub.session_ids) or [None] * len(sub.prompts)
                ereqs = await asyncio.gather(*(
                    self.engine_request(engine, p, sub.params, rid, truncate=sub.truncate, session_id=key)
                    for p, rid, key in zip(sub.prompts, sub.request_ids, keys)))
                if sub.rank or sub.batch:
                    ereqs = [dataclasses.replace(e, rank=sub.rank, priority=PRIORITY_BATCH if sub.batch
                                                 else e.priority) for e in ereqs]
                async with self._run(engine, list(ereqs), sub.best_of, t0, limits,
                                     NullObserver() if sub.batch else None) as run:
                    run.marks["admitted"] = admitted
                    yield run

    @contextlib.asynccontextmanager
    async def open_prepared(self, engine: EngineClient, ereqs: list[EngineRequest], t0: float) -> AsyncIterator[Run]:
        """A call whose engine requests are made already (a stored response's continuation after a restart:
        its prompt passed the input rules when it was first made): admitted at their rank, then run."""
        async with self.admitted(1, t0, rank=ereqs[0].rank):
            async with self._run(engine, ereqs, 1, t0) as run:
                yield run

    @contextlib.asynccontextmanager
    async def _run(self, engine: EngineClient, ereqs: list[EngineRequest], best_of: int, t0: float,
                   limits: Timeouts | None = None, observer: RequestObserver | None = None) -> AsyncIterator[Run]:
        run = Run(engine, ereqs, best_of, t0, limits or self.timeouts, observer or self.observer)
        self.runs.add(run)
        try:
            yield run
        finally:
            self.runs.discard(run)

    def cut_all(self, err: MindieError) -> int:
        """End every call under way with ``err`` (streams get it as their last frame); how many there were."""
        runs = list(self.runs)
        for run in runs:
            run.cut(err)
        return len(runs)

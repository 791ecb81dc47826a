"""The async facade: ``async for event in engine.generate(request)``.

One dedicated thread runs the step loop (PyTorch releases the GIL inside ops); requests and
aborts reach it through a locked inbox, and each step's events go back to the event loop in one
thread-safe call. Closing or cancelling a ``generate`` iterator aborts the request, which frees
its KV blocks before the next step."""
from __future__ import annotations

import asyncio
import bisect
import dataclasses
import functools
import logging
import threading
from collections import deque
from typing import Any, AsyncIterator

from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.core import Event, LLMEngine
from mindie_service.engine.contract import (STEP_TOKEN_BOUNDS, EngineRequest, EngineStats, FailedEvent, InputFacts,
                                            PoolRequest, PoolResult, StepTokenCounts, TokenEvent, check_task)
from mindie_service.engine.pooling.pool_setup import Pooling, check_pool_request, setup_pooling
from mindie_service.errors import GenerationError, IncompleteGenerationError, MindieError, UnhealthyError

logger = logging.getLogger(__name__)

_Stream = tuple[asyncio.AbstractEventLoop, "asyncio.Queue[Any]"]  # events, a PoolResult, or an exception


class AsyncEngine:
    """The real engine as an ``EngineClient`` (engine/client.py)."""

    def __init__(self, config: EngineConfig, engine: LLMEngine | None = None) -> None:
        self.engine = engine or LLMEngine(config)
        self.config = self.engine.cfg
        # One tokenizer per model: the frontend's pool encodes with the object the engine thread decodes with (no
        # caller changes its truncation, padding or tokens, so concurrent calls only read it).
        self.tokenizer = self.engine.tokenizer
        self.model_name = self.config.model_name or self.config.model.rstrip("/").rsplit("/", 1)[-1]
        self.vocab_size = self.engine.vocab_size
        self.eos_token_ids = self.engine.eos_token_ids
        self.device_type = self.engine.device_info.type
        self.device_reason = self.engine.device_info.reason
        self.dtype = str(self.engine.dtype).removeprefix("torch.")
        self.input_facts = input_facts(self.engine, tokenizer=self.tokenizer)
        enc = self.engine.mm_encoder
        self.modalities = frozenset(enc.modalities) if enc is not None else frozenset()
        self.weights_report = dict(getattr(self.engine.model, "weights_report", None) or {})
        self.pooling = engine_pooling(self.engine)
        self.tasks = self.pooling.tasks  # what it serves: "generate", "embed", "score" (models/pooling_spec.py)
        self.pooling_info = self.pooling.spec.to_json() if "embed" in self.tasks else {}
        self._cond = threading.Condition()
        self._inbox: deque[tuple[str, Any]] = deque()
        self._streams: dict[str, _Stream] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._dead: str | None = None
        self._step_counts = [0] * (len(STEP_TOKEN_BOUNDS) + 1)  # engine steps by tokens (EngineStats.iteration_tokens)
        self._step_total = 0

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if hasattr(self.engine, "shutdown"):
            self.engine.shutdown()  # a tensor-parallel engine's worker ranks (engine.runner.parallel)

    def healthy(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._dead is None

    def stats(self) -> EngineStats:
        steps = StepTokenCounts(tuple(self._step_counts), self._step_total)
        return dataclasses.replace(self.engine.stats(), iteration_tokens=steps)

    def _count_step(self, events: list[Event]) -> None:
        """One step's tokens as vLLM counts them: each output token, and a prompt's tokens in the step that gave
        its first token (vllm.v1.metrics.stats.IterationStats)."""
        n = sum(1 + ev.num_prompt_tokens for ev in events if isinstance(ev, TokenEvent))
        if n:
            self._step_counts[bisect.bisect_left(STEP_TOKEN_BOUNDS, n)] += 1
            self._step_total += n

    def tokenize(self, text: str) -> list[int]:
        return _tokenize(self.tokenizer, text)

    def detokenize(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)

    # ------------------------------------------------------------ requests
    def _post(self, kind: str, payload: Any) -> None:
        with self._cond:
            self._inbox.append((kind, payload))
            self._cond.notify()

    def abort(self, request_id: str) -> None:
        self._post("abort", request_id)

    async def pool(self, request: PoolRequest) -> PoolResult:
        """A prefill-only request (engine.pooling): ValidationError when this model does not serve its task or its
        ``dimensions``; cancelling the call drops its inputs not yet run."""
        check_pool_request(self.pooling, request, self.model_name)
        rid = request.request_id
        queue: asyncio.Queue[Any] = asyncio.Queue()
        with self._cond:  # as generate: refused here (503), or registered in time for the engine's failure
            if not self.healthy():
                raise UnhealthyError("the engine is not running")
            if rid in self._streams:
                raise GenerationError(f"request id {rid!r} is already running")
            self._streams[rid] = (asyncio.get_running_loop(), queue)
            self._inbox.append(("pool", request))
            self._cond.notify()
        got: Any = None
        try:
            got = await queue.get()
        finally:
            self._streams.pop(rid, None)
            if got is None:
                self.abort(rid)
        if isinstance(got, Exception):
            raise got
        return got

    # ------------------------------------------------------------ LoRA adapters
    # The registry is lock-protected and the pool is written only on the engine thread, so these are
    # safe beside the running loop; requests in flight keep their adapter.
    async def load_adapter(self, name: str, path: str) -> dict[str, Any]:
        """Read + validate off the IO loop. ConflictError (409) name taken; ValidationError (422) bad folder/rank."""
        return await asyncio.to_thread(self.engine.load_adapter, name, path)

    def unload_adapter(self, name: str) -> None:
        """NotFoundError (404) unknown name; ConflictError (409) while requests use it."""
        self.engine.unload_adapter(name)

    def list_adapters(self) -> list[dict[str, Any]]:
        """[{name, path, rank, targets, id, resident, in_use}] in load order."""
        return self.engine.list_adapters()

    def adapter_names(self) -> list[str]:
        return self.engine.lora.names()

    async def generate(self, request: EngineRequest) -> AsyncIterator[TokenEvent]:
        """``request`` comes from the input processor built from ``input_facts``. The engine binds its LoRA adapter (one unloaded since
        raises ValidationError, 422, from the first iteration)."""
        rid = request.request_id
        check_task(self.tasks, "generate", self.model_name)  # an embedding or rerank model (the serving core asks first)
        queue: asyncio.Queue[Event | Exception] = asyncio.Queue()
        # Checked and registered under the lock the engine thread takes when it dies: a request is either
        # refused here (503) or registered in time to get the engine's IncompleteGenerationError.
        with self._cond:
            if not self.healthy():
                raise UnhealthyError("the engine has stopped; the service is restarting" if self._dead
                                     else "the engine is not started")
            if rid in self._streams:
                raise GenerationError(f"request id {rid!r} is already running")
            self._streams[rid] = (asyncio.get_running_loop(), queue)
            self._inbox.append(("add", request))
            self._cond.notify()
        finished = False
        try:
            while True:
                ev = await queue.get()
                if isinstance(ev, Exception):
                    finished = True
                    raise ev
                if isinstance(ev, FailedEvent):
                    finished = True
                    raise GenerationError(ev.message)
                if ev.finish_reason is not None:
                    finished = True
                yield ev
                if finished:
                    return
        finally:
            self._streams.pop(rid, None)
            if not finished:
                self.abort(rid)

    # ------------------------------------------------------------ the engine thread
    def _deliver(self, items: list[tuple[str, Any]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Event | Exception]]] = {}
        for rid, ev in items:
            stream = self._streams.get(rid)
            if stream is not None:
                by_loop.setdefault(stream[0], []).append((stream[1], ev))
        for loop, puts in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, puts)
            except RuntimeError:  # the loop closed under us (shutdown)
                pass

    def _run(self) -> None:
        try:
            self.engine.runner.idle()  # what the load and the serve's setup freed, out of the RSS before any request
            while True:
                with self._cond:
                    while not self._inbox and not self._has_work() and not self._stopping:
                        self._cond.wait(timeout=1.0)
                        if hasattr(self.engine, "check_alive"):
                            self.engine.check_alive()  # a tensor-parallel rank that died while idle
                    if self._stopping:
                        return
                    cmds = list(self._inbox)
                    self._inbox.clear()
                out: list[tuple[str, Any]] = []
                for kind, payload in cmds:
                    if kind == "abort":
                        self.engine.abort_request(payload)
                        if self.pooling.batcher is not None:
                            self.pooling.batcher.abort(payload)
                        continue
                    if kind == "pool":
                        assert self.pooling.batcher is not None  # pool() checked the task
                        self.pooling.batcher.add(payload)
                        continue
                    request = payload
                    try:
                        self.engine.add_request(request)
                    except MindieError as exc:
                        out.append((request.request_id, exc))
                    except ValueError as exc:
                        out.append((request.request_id, GenerationError(str(exc))))
                if self.engine.has_work():
                    events = self.engine.step()
                    self._count_step(events)
                    out.extend((ev.request_id, ev) for ev in events)
                if self.pooling.batcher is not None and self.pooling.batcher.has_work():  # between steps
                    out.extend(self.pooling.batcher.step(self.engine.has_work()))
                if out:
                    self._deliver(out)
                    if not self._has_work():
                        self.engine.runner.idle()  # the run's workspaces and freed heap out of the RSS
        except BaseException as exc:  # noqa: BLE001 - the loop itself broke: fail everyone, report unhealthy
            self._die(exc)

    def _has_work(self) -> bool:
        return self.engine.has_work() or (self.pooling.batcher is not None and self.pooling.batcher.has_work())

    def _die(self, exc: BaseException) -> None:
        """Fail every request in flight at once (running, waiting, or still in the inbox) with a 500
        ``incomplete_generation``; from here on ``healthy()`` is False and ``generate`` answers 503."""
        with self._cond:
            self._dead = f"{type(exc).__name__}: {exc}"
            self._inbox.clear()
            rids = list(self._streams)
        logger.critical("engine thread died (%s); failing %d request(s) in flight", self._dead, len(rids),
                        exc_info=exc)
        # One exception object per request: each is raised in its own handler. The cause stays in the log.
        self._deliver([(rid, IncompleteGenerationError(
            f"Request {rid} did not finish: the engine stopped (the service is restarting)")) for rid in rids])

    @property
    def dead_reason(self) -> str | None:
        """Why the engine thread stopped (for the log), or None while it runs."""
        return self._dead


def input_facts(engine: LLMEngine, tokenize: Any = None, tokenizer: Any = None) -> InputFacts:
    """What the serving core (or the offline API) needs to build ``engine``'s input processor. ``tokenizer``
    defaults to the engine's own (the async facade passes its frontend instance). Nothing here refers to the
    facade itself: the serving core's processor for an engine must not keep a stopped engine alive."""
    cfg, tok = engine.cfg, tokenizer or engine.tokenizer
    return InputFacts(tokenize=tokenize or functools.partial(_tokenize, tok), vocab_size=engine.vocab_size,
                      max_input_len=cfg.effective_max_input_len, pool_tokens=engine.pool_tokens,
                      truncation=cfg.truncation, adapter_names=engine.lora.names, tokenizer=tok,
                      mm_encoder=engine.mm_encoder, video_frames=min(cfg.video_frames, cfg.max_video_frames),
                      sessions=engine.sessions, grammars=engine.grammar.compiler)


def engine_pooling(engine: LLMEngine) -> Pooling:
    """The engine's tasks and pooling room (engine.pooling), from its parts."""
    hidden = getattr(engine.runner, "prefill_hidden", None)  # a tensor-parallel runner has none
    return setup_pooling(engine.cfg, engine.architecture, engine.hf_config, engine.mm_encoder is not None,
                         engine.ranks is not None, engine.blocks, hidden, engine.model.compute_logits,
                         int(engine.model.dims.hidden))


def _tokenize(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text).input_ids)


def _put_all(puts: list[tuple[asyncio.Queue, Event | Exception]]) -> None:
    for q, ev in puts:
        q.put_nowait(ev)

"""The one generation path behind `/`, `/generate`, `/generate_stream` and the OpenAI routes: admission, parse and input
processing (off the IO loop), engine events with token/e2e timeouts, best_of fan-out, streaming,
disconnects, metrics. Routes differ only in their parser and encoder."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import time
from contextlib import aclosing
from typing import Any, AsyncIterator, Awaitable, Iterator

from tornado.iostream import StreamBufferFullError, StreamClosedError

from mindie_service.engine.client import EngineClient
from mindie_service.engine.contract import EngineRequest, TokenEvent
from mindie_service.protocol.encoders import Encoder, StreamState
from mindie_service.errors import GenerationError, MindieError, TimeoutError_
from mindie_service.protocol.generation import GenerationRequest, GenerationResult
from mindie_service.server.context import ServerContext
from mindie_service.server.handlers_base import BaseHandler

logger = logging.getLogger(__name__)

_ids = itertools.count(1)
_PREFIX = f"{os.getpid():x}"
_FRAMING_SLACK = 4096  # response headers, the stream's first frame and chunk framing, beside a frame


class GenerationHandler(BaseHandler):
    """Subclasses define ``parse`` (body -> GenerationRequest, runs in the tokenizer pool) and ``encoder``."""

    def initialize(self, ctx: ServerContext) -> None:
        super().initialize(ctx)
        self._task: asyncio.Future[bool] | None = None
        self._prep: asyncio.Future[list[EngineRequest]] | None = None
        self._queued: asyncio.Future[None] | None = None  # the wait in the admission queue
        self._client_gone = False
        self.request_id = f"{_PREFIX}-{next(_ids)}"

    def parse(self, body: dict[str, Any]) -> GenerationRequest:
        raise NotImplementedError

    def target(self, req: GenerationRequest) -> EngineClient:
        """The engine serving ``req``: the default model's (the OpenAI routes pick theirs by ``model``)."""
        return self.ctx.serving_engine()

    async def engine_requests(self, req: GenerationRequest, engine: EngineClient) -> list[EngineRequest]:
        """One engine request per prompt (the OpenAI completions route takes a list of prompts)."""
        return [await self.ctx.engine_request(req, self.request_id, engine=engine)]

    @property
    def encoder(self) -> Encoder:
        raise NotImplementedError

    def _parse_body(self) -> GenerationRequest:
        return self.parse(self.json_body())

    def on_connection_close(self) -> None:
        super().on_connection_close()  # fails the body future: an abandoned upload ends its handler
        self._client_gone = True
        if self._queued is not None and not self._queued.done():
            self._queued.cancel()  # leaves the admission queue
        if self._prep is not None and not self._prep.done():
            self._prep.cancel()  # stops media fetches; the tokenizer pool's current call still finishes
        if self._task is not None and not self._task.done():
            logger.info("%s: client disconnected, aborting", self.request_id)
            self._task.cancel()

    async def post(self) -> None:
        ctx = self.ctx
        t0 = time.monotonic()
        ctx.metrics.request_received.inc()
        ok = False
        try:
            # JSON decoding and validation run in the tokenizer pool, off the IO loop, before the admission
            # queue: a request that can never run takes no place in it.
            req = await self._unless_gone(ctx.run_blocking(self._parse_body))
            if req is None:  # the client left while its body waited in the tokenizer pool: never parsed
                return
            async with self._admitted(1, t0) as admitted:
                if not admitted or self._client_gone:  # no tokenizing or media work for a client that left
                    return
                self.engine = self.target(req)
                self._prep = asyncio.ensure_future(self.engine_requests(req, self.engine))
                try:
                    ereqs = await self._prep
                except asyncio.CancelledError:
                    if not self._client_gone:
                        raise
                    return
                if self._client_gone:
                    return
                ok = await self._answer(self._serve(req, ereqs, t0))
        finally:
            ctx.metrics.observe_request(ok=ok, e2e=time.monotonic() - t0)

    async def _unless_gone(self, work: Awaitable[Any]) -> Any:
        """``work``'s result, or None once the client has left: it runs as ``_prep``, which a disconnect
        cancels, and a job cancelled while still queued in the tokenizer pool never runs."""
        if self._client_gone:
            if asyncio.iscoroutine(work):
                work.close()
            return None
        self._prep = asyncio.ensure_future(work)
        try:
            return await self._prep
        except asyncio.CancelledError:
            if not self._client_gone:
                raise
            return None

    @contextlib.asynccontextmanager
    async def _admitted(self, n: int, t0: float) -> AsyncIterator[bool]:
        """Hold ``n`` admission slots (ServerContext.admit) for the block; yields False, holding none, when
        the client left while queued. Time in the queue counts against e2eTimeout."""
        left = self.ctx.settings.e2e_timeout - (time.monotonic() - t0)
        self._queued = asyncio.ensure_future(self.ctx.admit(n, timeout=left))
        try:
            await self._queued
        except asyncio.CancelledError:
            if not self._client_gone:
                raise
            logger.info("%s: client disconnected while queued", self.request_id)
            yield False
            return
        try:
            yield True
        finally:
            self.ctx.release(n)

    async def _answer(self, coro: Any) -> bool:
        """Run the response as a task that a client disconnect cancels; False when the client left."""
        self._task = asyncio.ensure_future(coro)
        try:
            return await self._task
        except asyncio.CancelledError:
            if not self._client_gone:
                raise
            return False

    async def _serve(self, req: GenerationRequest, ereqs: list[EngineRequest], t0: float) -> bool:
        samples = [self._sample(e, i, req.best_of) for e in ereqs for i in range(req.best_of)]
        if req.stream:
            return await self._stream(req, samples, t0)
        tasks = [asyncio.ensure_future(self._collect(s, t0)) for s in samples]
        try:
            results = list(await asyncio.gather(*tasks))
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        self.write_json(self.encoder.complete(req, results))
        return True

    def _sample(self, ereq: EngineRequest, index: int, best_of: int) -> EngineRequest:
        """Sample ``index`` of a best_of (OpenAI: ``n``) request: its own request id and its own params (a
        given seed moves by ``index`` so that the samples differ and each stays reproducible)."""
        if best_of == 1:
            return ereq
        p = ereq.params
        seed = None if p.seed is None else (p.seed + index) % (1 << 64)
        return dataclasses.replace(ereq, request_id=f"{ereq.request_id}.{index}",
                                   params=dataclasses.replace(p, seed=seed))

    async def _collect(self, ereq: EngineRequest, t0: float) -> GenerationResult:
        result = GenerationResult()
        async with aclosing(self._events(ereq, t0)) as events:
            async for ev in events:
                result.add(ev)
        return result

    async def _merged(self, samples: list[EngineRequest], t0: float) -> AsyncIterator[tuple[int, TokenEvent]]:
        """(sample index, event) of every sample, as they come; closing it aborts them all."""
        if len(samples) == 1:
            async with aclosing(self._events(samples[0], t0)) as events:
                async for ev in events:
                    yield 0, ev
            return
        queue: asyncio.Queue[tuple[int, TokenEvent | BaseException | None]] = asyncio.Queue()

        async def pump(k: int, ereq: EngineRequest) -> None:
            try:
                async with aclosing(self._events(ereq, t0)) as events:
                    async for ev in events:
                        queue.put_nowait((k, ev))
                queue.put_nowait((k, None))
            except Exception as e:
                queue.put_nowait((k, e))

        tasks = [asyncio.ensure_future(pump(k, s)) for k, s in enumerate(samples)]
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

    async def _stream(self, req: GenerationRequest, samples: list[EngineRequest], t0: float) -> bool:
        enc = self.encoder
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Accel-Buffering", "no")
        results = [GenerationResult() for _ in samples]
        states = [StreamState(index=k) for k in range(len(samples))]
        started = slow = False
        with self._bounded_output():
            async with aclosing(self._merged(samples, t0)) as events:
                try:
                    async for k, ev in events:
                        results[k].add(ev)
                        if not started:
                            self.write(enc.stream_start(req, len(samples)))  # sent with the first token
                        started = True
                        self._send(enc.stream_frame(req, ev, results[k], states[k]))
                    self._send(enc.stream_end(req, results))
                except StreamClosedError:
                    self._client_gone = True
                    logger.info("%s: client disconnected mid-stream, aborting", self.request_id)
                    return False
                except StreamBufferFullError:
                    slow = True  # leaving the block aborts the request (its KV blocks are freed)
                except MindieError as e:
                    if not started:
                        raise  # nothing sent yet: a plain HTTP error response
                    logger.info("%s: error after the stream started: %s %s", self.request_id, e.error_type,
                                e.message)
                    try:
                        self._send(enc.stream_error(e))
                    except (StreamClosedError, StreamBufferFullError):
                        pass
                    return False
        if slow:
            self._drop_slow_client()
            return False
        return True

    # -- slow readers: output a client has not taken is bounded by maxStreamBufferBytes -------------------
    @contextlib.contextmanager
    def _bounded_output(self) -> Iterator[None]:
        """While streaming, a write (``_send``) is refused with StreamBufferFullError when more than
        maxStreamBufferBytes written before it are still unsent; lifted afterwards (the connection may serve
        other responses)."""
        try:
            yield
        finally:
            stream = self.request.connection.stream
            if stream is not None:
                stream.max_write_buffer_size = None

    def _send(self, data: bytes | str) -> None:
        """Write ``data`` and hand it to the socket without waiting for the client to take it: a slow reader
        never holds this request's events (or the engine) back; its output is bounded by _bounded_output."""
        chunk = data.encode("utf-8") if isinstance(data, str) else data
        self.write(chunk)
        # Tornado refuses a write when the unsent bytes plus the write pass its bound: moving the bound with
        # each write counts only what the client has not taken, never one large frame (nor the headers).
        self.request.connection.stream.max_write_buffer_size = (
            self.ctx.settings.max_stream_buffer_bytes + len(chunk) + _FRAMING_SLACK)
        self.flush()  # not awaited: Tornado's stream sends what the socket takes and buffers the rest

    def _drop_slow_client(self) -> None:
        """Close the connection of a client too slow to take its stream (the request was aborted already)."""
        logger.warning("%s: the client is not reading its stream: more than %d bytes unsent "
                       "(ServerConfig.maxStreamBufferBytes); request aborted, connection closed", self.request_id,
                       self.ctx.settings.max_stream_buffer_bytes)
        self.ctx.metrics.stream_aborted_slow_client.inc()
        self.request.connection.close()
        self._finished = True  # Tornado must not finish the response on the closed connection

    async def _events(self, ereq: EngineRequest, t0: float) -> AsyncIterator[TokenEvent]:
        """The engine's events for ``ereq``, under tokenTimeout and e2eTimeout.
        Closing this generator (finished, failed, cancelled or abandoned) closes the engine's, which
        aborts the request and frees its KV blocks."""
        s, ctx = self.ctx.settings, self.ctx
        loop = asyncio.get_running_loop()
        deadline = loop.time() - (time.monotonic() - t0) + s.e2e_timeout
        rid = ereq.request_id
        agen = self.engine.generate(ereq)
        first: float | None = None
        n, prompt_n = 0, len(ereq.prompt_token_ids)
        try:
            while True:
                left = deadline - loop.time()
                try:
                    async with asyncio.timeout(max(0.0, min(s.token_timeout, left))):
                        ev = await anext(agen)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    key, limit = (("e2eTimeout", s.e2e_timeout) if left <= s.token_timeout
                                  else ("tokenTimeout", s.token_timeout))
                    raise TimeoutError_(f"generation timed out after {n} tokens "
                                        f"(ServerConfig.{key} = {limit:g} s)") from None
                except MindieError:
                    raise
                except Exception:  # the engine broke on this request: 424, the server goes on
                    logger.exception("%s: engine error", rid)  # the details stay in the log, never in the reply
                    raise GenerationError(f"Request {rid} failed during generation") from None
                if first is None:
                    first = time.monotonic()
                    prompt_n = ev.num_prompt_tokens or prompt_n
                n += 1
                yield ev
                if ev.finish_reason is not None:
                    return
        finally:
            await agen.aclose()
            ctx.metrics.observe_sequence(prompt_tokens=prompt_n, generated=n,
                                         ttft=None if first is None else first - t0, e2e=time.monotonic() - t0)

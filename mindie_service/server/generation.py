"""HTTP streaming for the generation routes: each request runs as one task that a client disconnect cancels
(which leaves the admission queue, drops queued tokenizer work and aborts the engine requests), SSE framing,
and the slow-reader bound. What a request does lives in the serving core (mindie_service.serving): the
routes differ only in their parser and encoder."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from contextlib import aclosing
from typing import Any, Coroutine, Iterator

from tornado.iostream import StreamBufferFullError, StreamClosedError

from mindie_service.catalog.catalog import Target
from mindie_service.engine.client import EngineClient
from mindie_service.errors import MindieError
from mindie_service.params.keep_alive import take_keep_alive
from mindie_service.protocol.encoders import Encoder, StreamState
from mindie_service.protocol.request import GenerationRequest, GenerationResult
from mindie_service.server.context import ServerContext
from mindie_service.server.handlers_base import BaseHandler
from mindie_service.serving import Frontend, Run, Submission

logger = logging.getLogger(__name__)

_FRAMING_SLACK = 4096  # response headers, the stream's first frame and chunk framing, beside a frame


class StreamingHandler(BaseHandler):
    """A request served by one task (``serve``): a client that leaves cancels it; output a client does not
    read is bounded by ServerConfig.maxStreamBufferBytes."""

    def initialize(self, ctx: ServerContext) -> None:
        super().initialize(ctx)
        self._task: asyncio.Future[bool] | None = None
        self._client_gone = False
        self.run: Run | None = None  # the generation's Run, for the access log (its usage)
        self._held: Target | None = None  # the catalog model serving this request, held until it ends

    # -- the model: loaded on demand through the one door (ServerContext.hold), held until the request ends -------
    async def hold_model(self, model: str | None = None, keep_alive: float | None = None) -> Target | None:
        """Hold ``model`` (None: the default model, behind `/`, TGI, REST and v2), loading it first when it is
        stopped or asleep; the wait counts in the request's time to first token (it runs after the tally's t0)."""
        if self.ctx.catalog is None or not self.ctx.ready:
            return None  # the gate answers (503 while the default model loads at start-up)
        self._release()
        name = model or self.ctx.model_name
        before = self.ctx.catalog.entries.get(name)
        loading = before is not None and before.state != "running"
        t0 = time.monotonic()
        self._held = await self.ctx.hold(name, keep_alive)
        if loading:  # the client can tell a load's wait from the model's own time to first token
            self.set_header("X-Model-Load-Wait", f"{time.monotonic() - t0:.3f}")
        return self._held

    def held_engine(self) -> EngineClient:
        """The held model's engine, else the default model's (503 when it is not running)."""
        return self._held.engine if self._held is not None else self.ctx.serving_engine()

    def _release(self) -> None:
        if self._held is not None and self.ctx.catalog is not None:
            self.ctx.catalog.release(self._held)
            self._held = None

    def on_finish(self) -> None:
        self._release()
        super().on_finish()

    @property
    def frontend(self) -> Frontend:
        return self.ctx.frontend

    def on_connection_close(self) -> None:
        super().on_connection_close()  # fails the body future: an abandoned upload ends its handler
        self._client_gone = True
        if self._task is not None and not self._task.done():
            logger.info("%s: client disconnected, aborting", self.request_id)
            self._task.cancel()
        self._release()  # an aborted request's sequences still count (Residency.idle reads the engine)

    async def serve(self, work: Coroutine[Any, Any, bool]) -> bool:
        """Run ``work`` as the task a disconnect cancels; False when the client left (before or during it)."""
        if self._client_gone:
            work.close()
            return False
        self._task = asyncio.ensure_future(work)
        try:
            return await self._task
        except asyncio.CancelledError:
            if not self._client_gone:
                raise
            return False

    def start_stream(self, content_type: str) -> None:
        self.set_header("Content-Type", content_type)
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Accel-Buffering", "no")

    def client_left(self) -> bool:
        """The stream's socket closed under a write: the caller leaves its events block (aborting them)."""
        self._client_gone = True
        logger.info("%s: client disconnected mid-stream, aborting", self.request_id)
        return False

    # -- slow readers: output a client has not taken is bounded by maxStreamBufferBytes -------------------
    @contextlib.contextmanager
    def bounded_output(self) -> Iterator[None]:
        """While streaming, a write (``send``) is refused with StreamBufferFullError when more than
        maxStreamBufferBytes written before it are still unsent; lifted afterwards (the connection may serve
        other responses)."""
        try:
            yield
        finally:
            stream = self.request.connection.stream
            if stream is not None:
                stream.max_write_buffer_size = None

    def send(self, data: bytes | str) -> None:
        """Write ``data`` and hand it to the socket without waiting for the client to take it: a slow reader
        never holds this request's events (or the engine) back; its output is bounded by bounded_output."""
        chunk = data.encode("utf-8") if isinstance(data, str) else data
        if not chunk:
            return  # an encoder with nothing to say for this event (a held-back tool-call marker)
        self.write(chunk)
        # Tornado refuses a write when the unsent bytes plus the write pass its bound: moving the bound with
        # each write counts only what the client has not taken, never one large frame (nor the headers).
        self.request.connection.stream.max_write_buffer_size = (
            self.ctx.settings.max_stream_buffer_bytes + len(chunk) + _FRAMING_SLACK)
        self.flush()  # not awaited: Tornado's stream sends what the socket takes and buffers the rest

    def drop_slow_client(self) -> bool:
        """Close the connection of a client too slow to take its stream (the request was aborted already)."""
        logger.warning("%s: the client is not reading its stream: more than %d bytes unsent "
                       "(ServerConfig.maxStreamBufferBytes); request aborted, connection closed", self.request_id,
                       self.ctx.settings.max_stream_buffer_bytes)
        self.ctx.metrics.stream_aborted_slow_client.inc()
        self.request.connection.close()
        self._finished = True  # Tornado must not finish the response on the closed connection
        return False


class GenerationHandler(StreamingHandler):
    """`/`, TGI and OpenAI: subclasses define ``parse`` (body -> GenerationRequest, runs in the tokenizer pool)
    and ``encoder``; ``target`` and ``submission`` say which engine and which prompts."""

    def parse(self, body: dict[str, Any]) -> GenerationRequest:
        raise NotImplementedError

    @property
    def encoder(self) -> Encoder:
        raise NotImplementedError

    def target(self, req: GenerationRequest) -> EngineClient:
        """The engine serving ``req``: the held model's (the default model's, unless ``model`` picked another)."""
        return self.held_engine()

    async def hold_for(self, body: dict[str, Any], keep_alive: float | None) -> None:
        """Hold the model ``body`` names (the OpenAI routes read ``model``); here the default model."""
        await self.hold_model(None, keep_alive)

    def submission(self, req: GenerationRequest) -> Submission:
        return Submission([req.prompt], req.params, lambda: self.target(req), [self.engine_id],
                          truncate=req.truncate, best_of=req.best_of, rank=req.rank)

    def _read_body(self) -> tuple[dict[str, Any], float | None]:
        body = self.json_body()
        return body, take_keep_alive(body)  # every route's keep_alive, taken before the dialect's parser

    async def post(self) -> None:
        with self.frontend.tally() as tally:
            tally.ok = await self.serve(self._generate(tally.t0))

    async def _generate(self, t0: float) -> bool:
        # JSON decoding and validation run in the tokenizer pool, off the IO loop, before the admission
        # queue: a request that can never run takes no place in it.
        body, keep_alive = await self.ctx.run_blocking(self._read_body)
        await self.hold_for(body, keep_alive)
        req = await self.ctx.run_blocking(self.parse, body)
        async with self.frontend.open(self.submission(req), t0) as run:
            self.run = run
            if req.stream:
                return await self._stream(req, run)
            results = await run.results()
            body = self.encoder.complete(req, results)
            self.completed(req, results, body)
            self.write_json(body)
            return True

    def completed(self, req: GenerationRequest, results: list[GenerationResult], body: Any = None) -> None:
        """A request answered in full (``body``: the whole answer; None when streamed), called before its last
        bytes go out: the chat route stores it here when asked to."""

    async def _stream(self, req: GenerationRequest, run: Run) -> bool:
        enc, n = self.encoder, len(run.samples)
        self.start_stream("text/event-stream; charset=utf-8")
        results = [GenerationResult() for _ in range(n)]
        states = [StreamState(index=k) for k in range(n)]
        started = False
        with self.bounded_output():
            async with aclosing(run.events()) as events:
                try:
                    async for k, ev in events:
                        results[k].add(ev)
                        if not started:
                            self.write(enc.stream_start(req, n, results[k]))  # sent with the first token
                        started = True
                        self.send(enc.stream_frame(req, ev, results[k], states[k]))
                    self.completed(req, results)
                    self.send(enc.stream_end(req, results))
                except StreamClosedError:
                    return self.client_left()
                except StreamBufferFullError:
                    pass  # leaving the block aborts the request (its KV blocks are freed)
                except MindieError as e:
                    if not started:
                        raise  # nothing sent yet: a plain HTTP error response
                    logger.info("%s: error after the stream started: %s %s", self.request_id, e.error_type,
                                e.message)
                    with contextlib.suppress(StreamClosedError, StreamBufferFullError):
                        self.send(enc.stream_error(e))
                    return False
                else:
                    return True
        return self.drop_slow_client()

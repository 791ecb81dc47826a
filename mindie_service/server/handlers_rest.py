"""The seed REST API: POST /api/generate-one (text/plain, streamed as raw chunks) and /api/generate-batch
(a JSON list in request order). Both go through the one generation path (server.generation): admission,
the input processor, the engine's events under tokenTimeout/e2eTimeout, metrics.

A ``request_id`` is the client's key: at most one request runs per key (a second gets 409), and with
an engine that keeps sessions, a key whose earlier generation finished continues it."""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from contextlib import aclosing
from dataclasses import dataclass
from typing import Iterator

from tornado.iostream import StreamBufferFullError, StreamClosedError

from mindie_service.engine.contract import EngineRequest
from mindie_service.errors import ConflictError, MindieError
from mindie_service.generation_config import GenerationConfig
from mindie_service.inputs.types import TextPrompt
from mindie_service.protocol.rest import (RestPrompt, RestRequest, parse_generate_batch, parse_generate_one,
                                          parse_rest_body)
from mindie_service.server.generation import GenerationHandler

logger = logging.getLogger(__name__)

_ids = itertools.count(1)
_PREFIX = f"api-{os.getpid():x}"


@dataclass
class _Item:
    """One prompt of the call: its engine request and what it produced."""

    prompt: RestPrompt
    ereq: EngineRequest
    text: str = ""
    ok: bool = False


class _RestHandler(GenerationHandler):
    """Shared by both routes: parse, claim the request ids, build the engine requests, then serve."""

    def parse_rest(self, body: dict, defaults: GenerationConfig) -> RestRequest:
        raise NotImplementedError

    def _defaults(self) -> GenerationConfig:
        return GenerationConfig().merged(self.ctx.config.generation_defaults)

    def _parse(self) -> RestRequest:
        return self.parse_rest(parse_rest_body(self.body()), self._defaults())

    async def post(self) -> None:
        ctx = self.ctx
        t0 = time.monotonic()
        ctx.metrics.request_received.inc()
        n, ok = 1, False
        try:
            req: RestRequest | None = await self._unless_gone(ctx.run_blocking(self._parse))
            if req is None:  # the client left while its body waited in the tokenizer pool: never parsed
                return
            n = len(req.prompts)  # a batch counts as that many requests, in admission and in metrics
            ctx.metrics.request_received.inc(n - 1)
            async with self._admitted(n, t0) as admitted:
                if not admitted or self._client_gone:  # the client left while queued: no tokenizing
                    return
                with self._claim(req):
                    self.engine = ctx.serving_engine()
                    params = req.params()
                    ereqs = await self._unless_gone(asyncio.gather(*(
                        ctx.engine_request_for(TextPrompt(p.prompt), params, f"{_PREFIX}-{next(_ids)}",
                                               engine=self.engine, session_id=p.request_id) for p in req.prompts)))
                    if ereqs is None:
                        return
                    items = [_Item(p, e) for p, e in zip(req.prompts, ereqs)]
                    if self._client_gone:
                        return
                    ok = await self._answer(self._serve_rest(req, items, t0))
        finally:
            for _ in range(n):
                ctx.metrics.observe_request(ok=ok, e2e=time.monotonic() - t0)

    def _claim(self, req: RestRequest) -> "_claimed":
        return _claimed(self.ctx.active_request_ids, [p.request_id for p in req.prompts])

    def _prefix(self, req: RestRequest, ereq: EngineRequest) -> str:
        """only_new_tokens false: the prompt as the model saw it (a continuation: the whole session so far)."""
        if req.only_new_tokens:
            return ""
        return self.engine.detokenize(list(ereq.prompt_token_ids))

    async def _serve_rest(self, req: RestRequest, items: list[_Item], t0: float) -> bool:
        raise NotImplementedError

    async def _text(self, item: _Item, t0: float) -> str:
        """The whole generated text of ``item`` (a non-streamed answer)."""
        parts: list[str] = []
        async with aclosing(self._events(item.ereq, t0)) as events:
            async for ev in events:
                parts.append(ev.text_delta)
        return "".join(parts)


class _claimed:
    """Hold the request ids for the call: a key already running (here or in another call) is a 409."""

    def __init__(self, active: set[str], ids: list[str]) -> None:
        self.active, self.ids = active, ids

    def __enter__(self) -> None:
        busy = [i for i in self.ids if i in self.active]
        if busy:
            raise ConflictError(f"request_id {busy[0]!r} is already being generated; wait for it to finish")
        self.active.update(self.ids)

    def __exit__(self, *exc: object) -> None:
        self.active.difference_update(self.ids)


class GenerateOneHandler(_RestHandler):
    """POST /api/generate-one -> text/plain; streamed as HTTP chunks of whole UTF-8 characters."""

    def parse_rest(self, body: dict, defaults: GenerationConfig) -> RestRequest:
        return parse_generate_one(body, defaults)

    async def _serve_rest(self, req: RestRequest, items: list[_Item], t0: float) -> bool:
        item = items[0]
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        if not req.stream:
            text = await self._text(item, t0)
            self.finish((self._prefix(req, item.ereq) + text).encode("utf-8"))
            return True
        if req.config.num_beams > 1:  # beam search: the chosen beam is sent once, as one chunk, when chosen
            text = await self._text(item, t0)
            self.write((self._prefix(req, item.ereq) + text).encode("utf-8"))
            await self.flush()
            return True
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Accel-Buffering", "no")
        started = False
        try:
            with self._bounded_output():  # a client that does not read: aborted past maxStreamBufferBytes
                async with aclosing(self._events(item.ereq, t0)) as events:
                    head = self._prefix(req, item.ereq)
                    async for ev in events:
                        # The detokenizer never emits half a character, so each chunk is whole UTF-8.
                        chunk = head + ev.text_delta
                        head = ""
                        if chunk:
                            started = True
                            self._send(chunk.encode("utf-8"))
        except StreamClosedError:
            self._client_gone = True
            logger.info("%s: client disconnected mid-stream, aborting", self.request_id)
            return False
        except StreamBufferFullError:  # the engine's generator is closed already: the request is aborted
            self._drop_slow_client()
            return False
        except MindieError as e:
            if not started:
                raise  # nothing sent yet: a plain HTTP error response
            # A text stream has no error frame: end the chunked body without its last chunk, so the
            # client sees a truncated response instead of a complete one.
            logger.warning("%s: error after the stream started, truncating the response: %s %s",
                           self.request_id, e.error_type, e.message)
            self.request.connection.close()
            self._finished = True  # tornado must not write the terminating chunk
            return False
        return True


class GenerateBatchHandler(_RestHandler):
    """POST /api/generate-batch -> [{request_id, prompt?, response}] in request order."""

    def parse_rest(self, body: dict, defaults: GenerationConfig) -> RestRequest:
        return parse_generate_batch(body, defaults)

    async def _serve_rest(self, req: RestRequest, items: list[_Item], t0: float) -> bool:
        # Every prompt is handed to the engine at once, so they are scheduled into the same batch.
        tasks = [asyncio.ensure_future(self._one(it, t0)) for it in items]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        self.write_json(list(_results(req, items, self)))
        return True

    async def _one(self, item: _Item, t0: float) -> None:
        item.text, item.ok = await self._text(item, t0), True


def _results(req: RestRequest, items: list[_Item], h: _RestHandler) -> Iterator[dict[str, str]]:
    for it in items:
        out = {"request_id": it.prompt.request_id}
        if not req.only_new_tokens:
            out["prompt"] = h._prefix(req, it.ereq)
        out["response"] = it.text
        yield out

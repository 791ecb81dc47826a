"""The OpenAI Responses API on the business port (the work is serving.responses_service's):

    POST   /v1/responses                       create: whole, streamed, or background (queued at once)
    GET    /v1/responses/{id}                  the stored response; ?stream=true&starting_after=N replays and
                                               follows a background stream after event N
    DELETE /v1/responses/{id}
    GET    /v1/responses/{id}/input_items      paginated (after, limit, order) as OpenAI's list
    POST   /v1/responses/{id}/cancel           a background response ends cancelled

Errors in OpenAI's shape. A stored response belongs to the API key that made it (server.responses_prepare)."""
from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any, AsyncIterator

from tornado.iostream import StreamBufferFullError, StreamClosedError

from mindie_service.errors import MindieError, ValidationError, check
from mindie_service.protocol.openai_encoder import openai_error
from mindie_service.protocol.responses_encoder import error_event, frame
from mindie_service.protocol.responses_events import Event
from mindie_service.server.generation import StreamingHandler
from mindie_service.server.responses_prepare import owner_of, prepare_held
from mindie_service.serving.responses_service import ResponsesService

logger = logging.getLogger(__name__)


class _ResponsesHandler(StreamingHandler):
    def error_json(self, err: MindieError) -> Any:
        status, body = openai_error(err)
        self.set_status(status)
        return body

    @property
    def service(self) -> ResponsesService:
        return self.ctx.responses_service()

    def owner(self) -> str:
        return owner_of(self)

    async def write_events(self, batches: AsyncIterator[list[Event]], obfuscate: bool = False) -> bool:
        """SSE frames of each batch (``obfuscate``: delta events padded); an error before the first is a plain
        error answer, one after it the stream's ``error`` event."""
        started = False
        with self.bounded_output():
            try:
                async for batch in batches:
                    if not started:
                        self.start_stream("text/event-stream; charset=utf-8")
                        started = True
                    self.send(b"".join(frame(e, obfuscate) for e in batch))
                return True
            except StreamClosedError:
                return self.client_left()
            except StreamBufferFullError:
                pass
            except MindieError as e:
                if not started:
                    raise
                with contextlib.suppress(StreamClosedError, StreamBufferFullError):
                    self.send(frame(error_event(e, -1)))
                return False
            finally:
                with contextlib.suppress(Exception):
                    await batches.aclose()  # type: ignore[attr-defined]
        return self.drop_slow_client()


async def _batches(events: AsyncIterator[Event]) -> AsyncIterator[list[Event]]:
    async for e in events:
        yield [e]


class ResponsesHandler(_ResponsesHandler):
    """POST /v1/responses."""

    async def post(self) -> None:
        with self.frontend.tally() as tally:
            tally.ok = await self.serve(self._create(tally.t0))

    async def _create(self, t0: float) -> bool:
        body = await self.ctx.run_blocking(self.json_body)
        svc, owner = self.service, self.owner()
        prev = body.get("previous_response_id")
        context = svc.history(prev if isinstance(prev, str) else None, owner)
        p = await prepare_held(self.ctx, body, context, self.request_id)
        obfuscate = p.req.options.obfuscate
        if p.req.options.background:
            try:
                resp = await svc.submit(p, owner, context)  # the task releases the model
            except BaseException:
                p.release()
                raise
            if not p.req.stream:
                self.write_json(resp)
                return True
            return await self.write_events(_batches(svc.events(resp["id"], owner, -1)), obfuscate)
        try:
            watch = functools.partial(setattr, self, "run")  # the access log's usage
            if not p.req.stream:
                self.write_json(await svc.whole(p, owner, context, t0, watch))
                return True
            return await self.write_events(svc.stream(p, owner, context, t0, watch), obfuscate)
        finally:
            p.release()


class ResponseHandler(_ResponsesHandler):
    """GET (and ?stream=true) / DELETE /v1/responses/{id}."""

    async def get(self, rid: str) -> None:
        if self.get_query_argument("stream", "false") != "true":
            self.write_json(self.service.get(rid, self.owner()))
            return
        after = self.get_query_argument("starting_after", "-1")
        check(after.lstrip("-").isdigit() and int(after) >= -1, "starting_after", "an event's sequence_number", after)
        obfuscate = self.get_query_argument("include_obfuscation", "false")
        check(obfuscate in ("true", "false"), "include_obfuscation", "true or false", obfuscate)
        events = self.service.events(rid, self.owner(), int(after))
        await self.serve(self.write_events(_batches(events), obfuscate == "true"))

    def delete(self, rid: str) -> None:
        self.write_json(self.service.delete(rid, self.owner()))


class ResponseCancelHandler(_ResponsesHandler):
    """POST /v1/responses/{id}/cancel."""

    async def post(self, rid: str) -> None:
        self.write_json(await self.service.cancel(rid, self.owner()))


class ResponseInputItemsHandler(_ResponsesHandler):
    """GET /v1/responses/{id}/input_items: OpenAI's list (newest first unless order=asc)."""

    def get(self, rid: str) -> None:
        items = self.service.items(rid, self.owner())
        order = self.get_query_argument("order", "desc")
        check(order in ("asc", "desc"), "order", "asc or desc", order)
        limit = self.get_query_argument("limit", "20")
        check(limit.isdigit() and 1 <= int(limit) <= 100, "limit", "an integer in [1, 100]", limit)
        seq = items if order == "asc" else items[::-1]
        after = self.get_query_argument("after", None)
        if after is not None:
            ids = [it.get("id") for it in seq]
            if after not in ids:
                raise ValidationError(f"Parameter after must be the id of one of this response's input items, "
                                      f"got {after!r}")
            seq = seq[ids.index(after) + 1:]
        page = seq[:int(limit)]
        self.write_json({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                         "last_id": page[-1]["id"] if page else None, "has_more": len(seq) > len(page)})

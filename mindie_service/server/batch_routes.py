"""The endpoints an OpenAI batch may name (jobs.batch_lines.BatchEndpoints), each answering one line with the
online route's own code: the same parser, the same serving core (at batch priority, no admission slot: the
batch runner bounds its lines) and the same encoder, so a line's body is what the route would have answered.
Errors in OpenAI's shape with the route's status. A batch line never streams.

Another route joins with ``ctx.batch_endpoints.register(url, fn)`` (``fn``: LineCall -> LineReply)."""
from __future__ import annotations

import time
from typing import Any

from mindie_service.errors import MindieError, ValidationError
from mindie_service.jobs.batch_lines import BatchEndpoints, LineCall, LineFn, LineReply
from mindie_service.protocol.openai import Kind
from mindie_service.protocol.openai_encoder import OpenAIEncoder, openai_error
from mindie_service.params.keep_alive import take_keep_alive
from mindie_service.server.handlers_openai import hold_route, parse_route, route_submission
from mindie_service.server.handlers_pooling import embeddings_line
from mindie_service.server.responses_prepare import prepare_held

_ENCODER = OpenAIEncoder()


def _no_stream(body: dict[str, Any], also: tuple[str, ...] = ()) -> None:
    for name in ("stream", *also):
        if body.get(name):
            raise ValidationError(f"Parameter {name}: a batch line is answered whole; {name} must be false or absent")


def _error(e: MindieError) -> LineReply:
    status, body = openai_error(e)
    return LineReply(status, body)


def openai_line(ctx: Any, kind: Kind) -> LineFn:
    """/v1/chat/completions (``chat``) or /v1/completions (``completion``)."""

    async def run(call: LineCall) -> LineReply:
        try:
            _no_stream(call.body)
            keep_alive = take_keep_alive(call.body)
            target = await hold_route(ctx, call.body, kind, keep_alive)  # loaded on demand, as the route does
            try:
                req = await ctx.run_blocking(parse_route, ctx, call.body, kind, call.request_id, target)
                sub = route_submission(req, lambda: target.engine, call.request_id, batch=True)
                async with ctx.frontend.open(sub, time.monotonic()) as r:
                    results = await r.results()
            finally:
                ctx.catalog.release(target)
            body = _ENCODER.complete(req, results)
            if req.client.store:  # chat's store: true, kept for the batch's owner as the route keeps it
                ctx.chat_store().put(call.owner, body, list(call.body.get("messages") or []),
                                     dict(req.client.metadata))
            return LineReply(200, body)
        except MindieError as e:
            return _error(e)

    return run


def responses_line(ctx: Any) -> LineFn:
    """/v1/responses: stored (``store``) for the batch's owner as the online route stores it."""

    async def run(call: LineCall) -> LineReply:
        try:
            _no_stream(call.body, ("background",))
            svc = ctx.responses_service()
            prev = call.body.get("previous_response_id")
            context = svc.history(prev if isinstance(prev, str) else None, call.owner)
            p = await prepare_held(ctx, call.body, context, call.request_id)
            try:
                return LineReply(200, await svc.whole(p, call.owner, context, time.monotonic(), batch=True))
            finally:
                p.release()
        except MindieError as e:
            return _error(e)

    return run


def register_batch_endpoints(table: BatchEndpoints, ctx: Any) -> None:
    """This server's generation routes in ``table``."""
    table.register("/v1/chat/completions", openai_line(ctx, "chat"))
    table.register("/v1/completions", openai_line(ctx, "completion"))
    table.register("/v1/responses", responses_line(ctx))
    table.register("/v1/embeddings", embeddings_line(ctx))

"""POST /v1/completions and /v1/chat/completions through the serving core (server/generation.py): the
``model`` field picks the catalog model (or adapter) and its engine; errors in OpenAI's shape."""
from __future__ import annotations

from typing import Any, Awaitable, Callable

from mindie_service.catalog.catalog import Target
from mindie_service.engine.client import EngineClient

from mindie_service.errors import MindieError, UnhealthyError
from mindie_service.protocol.encoders import Encoder
from mindie_service.protocol.request import GenerationRequest, GenerationResult, ProtocolLimits
from mindie_service.protocol.openai import Kind, OpenAIRequest, parse_openai, peek_model
from mindie_service.protocol.openai_encoder import OpenAIEncoder, openai_error
from mindie_service.server.generation import GenerationHandler
from mindie_service.server.handlers_chat_store import list_stored
from mindie_service.server.responses_prepare import owner_of
from mindie_service.server.model_tools import tool_format
from mindie_service.serving import Submission

_ENCODER = OpenAIEncoder()


async def hold_route(ctx: Any, body: dict[str, Any], kind: Kind, keep_alive: float | None,
                     hold: Callable[[str, float | None], Awaitable[Target | None]] | None = None) -> Target:
    """The catalog model ``body`` names, loaded on demand and held (``catalog.release`` it when done): through the
    handler's ``hold`` (it keeps the hold for its request) or the one door itself (a batch line)."""
    catalog = ctx.catalog
    if catalog is None:
        raise UnhealthyError("the model catalog is still loading")
    model = peek_model(body, catalog.default_id if kind == "chat" else None)
    target = await hold(model, keep_alive) if hold is not None else await ctx.hold(model, keep_alive)
    if target is None:
        raise ctx.loading_error()
    return target


def parse_route(ctx: Any, body: dict[str, Any], kind: Kind, request_id: str, target: Target) -> OpenAIRequest:
    """The request for ``target``, the held model ``body`` names: what the online route and a batch line
    (server/batch_routes.py) both do with a body."""
    model = peek_model(body, ctx.catalog.default_id if kind == "chat" else None)
    limits = ProtocolLimits(vocab_size=target.engine.vocab_size, media_policy=ctx.media_policy)
    return parse_openai(body, kind, limits=limits, model=model, defaults=target.defaults,
                        adapter_id=target.adapter_id, request_id=request_id,
                        tool_format=tool_format(target.engine, ctx))


def route_submission(req: OpenAIRequest, engine: Callable[[], EngineClient], engine_id: str,
                     batch: bool = False) -> Submission:
    """One engine request per prompt (the completions route takes a list of prompts)."""
    many = len(req.prompts) > 1
    ids = [f"{engine_id}-{k}" if many else engine_id for k in range(len(req.prompts))]
    return Submission(list(req.prompts), req.params, engine, ids, truncate=req.truncate, best_of=req.best_of,
                      rank=req.rank, batch=batch)


class OpenAIRouteHandler(GenerationHandler):
    """A generation route whose ``model`` field picks the catalog model (held until the request ends); the
    OpenAI routes, and Anthropic's Messages (server/handlers_anthropic.py) on the same footing."""

    kind: Kind = "completion"

    @property
    def encoder(self) -> Encoder:
        return _ENCODER

    def error_json(self, err: MindieError) -> Any:
        status, body = openai_error(err)
        self.set_status(status)  # a bad value is OpenAI's 400, not our 422
        return body

    async def hold_for(self, body: dict[str, Any], keep_alive: float | None) -> None:
        self._held = await hold_route(self.ctx, body, self.kind, keep_alive, self.hold_model)

    def parse(self, body: dict[str, Any]) -> GenerationRequest:
        if self._held is None:  # (the gate refuses first: the default model is still loading at start-up)
            raise self.ctx.loading_error()
        req = parse_route(self.ctx, body, self.kind, self.request_id, self._held)
        self.client_ids = req.client  # the access log records them (server/app.log_request)
        return req

    def submission(self, req: GenerationRequest) -> Submission:
        assert isinstance(req, OpenAIRequest)
        return route_submission(req, lambda: self.target(req), self.engine_id)


class CompletionsHandler(OpenAIRouteHandler):
    """POST /v1/completions."""

    kind = "completion"


class ChatCompletionsHandler(OpenAIRouteHandler):
    """POST /v1/chat/completions; GET lists the stored ones (server/handlers_chat_store.py)."""

    kind = "chat"

    def parse(self, body: dict[str, Any]) -> GenerationRequest:
        self._messages = body.get("messages") if isinstance(body, dict) else None
        return super().parse(body)

    def get(self) -> None:
        list_stored(self)

    def completed(self, req: GenerationRequest, results: list[GenerationResult], body: Any = None) -> None:
        """``store: true``: the whole completion (a stream's folded), its messages as sent and its metadata."""
        assert isinstance(req, OpenAIRequest)
        if req.client.store:
            whole = body if body is not None else self.encoder.complete(req, results)
            self.ctx.chat_store().put(owner_of(self), whole, list(self._messages or []), dict(req.client.metadata))

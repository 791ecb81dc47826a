"""POST /v1/messages and POST /v1/messages/count_tokens (Anthropic's Messages API) through the serving core, as the
chat route is served: the ``model`` field picks the catalog model (or adapter); the request is the chat route's
neutral one (protocol/anthropic_fields.py); answers and errors in Anthropic's shapes (protocol/anthropic_encoder.py).
API keys: ``x-api-key`` is taken beside ``Authorization: Bearer`` (server/auth.py)."""
from __future__ import annotations

from typing import Any

from mindie_service.engine.client import EngineClient
from mindie_service.errors import MindieError, UnhealthyError
from mindie_service.protocol.anthropic_encoder import AnthropicEncoder, anthropic_error
from mindie_service.protocol.anthropic_fields import AnthropicRequest, parse_count_tokens, parse_messages
from mindie_service.protocol.encoders import Encoder
from mindie_service.protocol.openai import peek_model
from mindie_service.protocol.request import GenerationRequest
from mindie_service.sampling_params import SamplingParams
from mindie_service.server.handlers_base import BaseHandler
from mindie_service.server.handlers_openai import OpenAIRouteHandler, tool_format
from mindie_service.serving import Submission

_ENCODER = AnthropicEncoder()


class MessagesHandler(OpenAIRouteHandler):
    """POST /v1/messages."""

    kind = "chat"

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("request-id", self.request_id)  # Anthropic's header (the SDK's message._request_id)

    @property
    def encoder(self) -> Encoder:
        return _ENCODER

    def error_json(self, err: MindieError) -> Any:
        status, body = anthropic_error(err)
        self.set_status(status)
        return body

    async def hold_for(self, body: dict[str, Any], keep_alive: float | None) -> None:
        if self.ctx.catalog is None:
            raise UnhealthyError("the model catalog is still loading")
        await self.hold_model(peek_model(body), keep_alive)  # Messages names its model: no default

    def parse(self, body: dict[str, Any]) -> GenerationRequest:
        target = self._held
        if target is None:
            raise self.ctx.loading_error()
        model = peek_model(body)
        req = parse_messages(body, model=model, policy=self.ctx.media_policy, vocab_size=target.engine.vocab_size,
                             adapter_id=target.adapter_id, request_id=self.request_id,
                             tool_format=tool_format(target.engine, self.ctx))
        self.client_ids = req.client  # the access log records metadata.user_id
        return req

    def submission(self, req: GenerationRequest) -> Submission:
        assert isinstance(req, AnthropicRequest)
        return Submission([req.prompt], req.params, lambda: self.target(req), [self.engine_id])


class CountTokensHandler(BaseHandler):
    """POST /v1/messages/count_tokens: ``{"input_tokens": N}``, the prompt /v1/messages would send the engine
    (chat template, tools, images expanded), counted by the same input processor."""

    def error_json(self, err: MindieError) -> Any:
        status, body = anthropic_error(err)
        self.set_status(status)
        return body

    async def post(self) -> None:
        catalog = self.ctx.catalog
        if catalog is None:
            raise UnhealthyError("the model catalog is still loading")
        body = self.json_body()
        model = peek_model(body)
        target = await self.ctx.hold(model, None)  # loaded on demand, as /v1/messages would
        try:
            engine: EngineClient = target.engine
            prompt = parse_count_tokens(body, tool_format(engine, self.ctx), self.ctx.media_policy)
            ereq = await self.ctx.frontend.engine_request(engine, prompt, SamplingParams(max_tokens=1),
                                                          self.engine_id)
        finally:
            catalog.release(target)
        self.write_json({"input_tokens": len(ereq.prompt_token_ids)})

"""MindIE routes on the business port: POST / (text and stream inference) and POST /v1/tokenizer."""
from __future__ import annotations

from typing import Any

from mindie_service.engine.client import EngineClient
from mindie_service.params.keep_alive import take_keep_alive
from mindie_service.protocol.encoders import Encoder
from mindie_service.errors import ValidationError
from mindie_service.protocol.request import GenerationRequest
from mindie_service.protocol.mindie import parse_mindie_request, parse_tokenizer_request
from mindie_service.server.generation import GenerationHandler
from mindie_service.server.handlers_base import BaseHandler


class MindieGenerateHandler(GenerationHandler):
    """POST /: MindIE's contract (TGI's client also talks to this route)."""

    def parse(self, body: dict[str, Any]) -> GenerationRequest:
        return parse_mindie_request(body, self.ctx.limits)

    @property
    def encoder(self) -> Encoder:
        return self.ctx.mindie_encoder


class TokenizerHandler(BaseHandler):
    """POST /v1/tokenizer {"inputs": "...", "keep_alive"?} -> {"token_number": N, "tokens": [ids]}."""

    async def post(self) -> None:
        body = self.json_body()
        keep_alive = take_keep_alive(body)  # Ollama's keep_alive, as on every generation route
        text = parse_tokenizer_request(body)
        if not self.ctx.ready:
            raise self.ctx.loading_error()
        async with self.ctx.held(self.ctx.model_name, keep_alive) as target:  # the default model, loaded on demand
            await self._answer(target.engine, text)

    async def _answer(self, engine: EngineClient, text: str) -> None:
        # A text longer than the model's whole context could ever take is refused before it is tokenized:
        # tokenizing a body-sized string costs seconds of CPU and gigabytes of memory for nothing.
        bound, limit = self.ctx.frontend.processor(engine).text_bound, self.ctx.engine_config.max_seq_len
        if bound is not None and len(text) > bound.refuse_over(limit):
            raise ValidationError(f"Parameter inputs must be at most {limit} tokens (maxSeqLen), got a text of "
                                  f"{len(text)} characters (more than {bound.refuse_over(limit)} characters cannot "
                                  f"fit in {limit} tokens of this tokenizer)")
        ids = await self.ctx.run_blocking(engine.tokenize, text)
        self.write_json({"token_number": len(ids), "tokens": ids})

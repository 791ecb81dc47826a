"""POST /v1/embeddings (OpenAI), /rerank and /v1/rerank (Jina / Cohere), /score (vLLM): the ``model`` field picks
the catalog model, the serving core runs the call (serving/pooling_calls.py), errors in OpenAI's shape (as vLLM
answers all three). A model that does not serve the route's task is a 400 naming which checkpoints do."""
from __future__ import annotations

import time
from typing import Any, Callable

from mindie_service.errors import MindieError, UnhealthyError, ValidationError
from mindie_service.protocol.openai_encoder import openai_error
from mindie_service.protocol.pooling_api import (PoolCall, embeddings_answer, parse_embeddings, parse_rerank,
                                                 parse_score, rerank_answer, score_answer)
from mindie_service.serving.pooling_calls import run_pool
from mindie_service.server.generation import StreamingHandler


class _PoolingRoute(StreamingHandler):
    """A client that leaves cancels the call (its inputs not yet run are dropped by the engine)."""

    parse: Callable[[dict[str, Any]], PoolCall]

    def error_json(self, err: MindieError) -> Any:
        status, body = openai_error(err)
        self.set_status(status)
        return body

    def answer(self, call: PoolCall, vectors: list[list[float]], prompt_tokens: int) -> dict[str, Any]:
        raise NotImplementedError

    async def post(self) -> None:
        with self.frontend.tally() as tally:
            tally.ok = await self.serve(self._call(tally.t0))

    async def _call(self, t0: float) -> bool:
        call = await self.ctx.run_blocking(lambda: type(self).parse(self.json_body()))
        catalog = self.ctx.catalog
        if catalog is None:
            raise UnhealthyError("the model catalog is still loading")
        target = catalog.resolve(call.model)
        try:
            if target.adapter_id is not None:
                raise ValidationError(f"Parameter model must name a base model for {call.task} requests, got the "
                                      f"LoRA adapter {call.model!r} (adapters apply to generation only)")
            got = await run_pool(self.frontend, target.engine, call.task, call.items, pairs=call.pairs,
                                 request_id=self.engine_id, t0=t0, dimensions=call.dimensions)
        finally:
            catalog.release(target)
        self.write_json(self.answer(call, got.vectors, got.num_prompt_tokens))
        return True


class EmbeddingsHandler(_PoolingRoute):
    """POST /v1/embeddings."""

    parse = staticmethod(parse_embeddings)

    def answer(self, call: PoolCall, vectors: list[list[float]], prompt_tokens: int) -> dict[str, Any]:
        return embeddings_answer(call, vectors, prompt_tokens)


class RerankHandler(_PoolingRoute):
    """POST /rerank and /v1/rerank."""

    parse = staticmethod(parse_rerank)

    def answer(self, call: PoolCall, vectors: list[list[float]], prompt_tokens: int) -> dict[str, Any]:
        return rerank_answer(call, self.engine_id, [v[0] for v in vectors], prompt_tokens)


class ScoreHandler(_PoolingRoute):
    """POST /score."""

    parse = staticmethod(parse_score)

    def answer(self, call: PoolCall, vectors: list[list[float]], prompt_tokens: int) -> dict[str, Any]:
        return score_answer(call, self.engine_id, int(time.time()), [v[0] for v in vectors], prompt_tokens)

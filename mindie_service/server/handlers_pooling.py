"""POST /v1/embeddings (OpenAI), /rerank and /v1/rerank (Jina / Cohere), /score (vLLM): the ``model`` field picks
the catalog model, the serving core runs the call (serving/pooling_calls.py), errors in OpenAI's shape (as vLLM
answers all three). A model that does not serve the route's task is a 400 naming which checkpoints do."""
from __future__ import annotations

import time
from typing import Any, Callable

from mindie_service.errors import MindieError, UnhealthyError, ValidationError
from mindie_service.params.keep_alive import take_keep_alive
from mindie_service.jobs.batch_lines import LineCall, LineFn, LineReply
from mindie_service.protocol.openai_encoder import openai_error
from mindie_service.protocol.pooling_api import (PoolCall, embeddings_answer, parse_embeddings, parse_rerank,
                                                 parse_score, rerank_answer, score_answer)
from mindie_service.serving.pooling_calls import run_pool
from mindie_service.server.generation import StreamingHandler

Answer = Callable[[PoolCall, list[list[float]], int], dict[str, Any]]  # the route's encoder of the vectors


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
        body = await self.ctx.run_blocking(self.json_body)
        keep_alive = take_keep_alive(body)  # Ollama's keep_alive, as on every generation route
        call = await self.ctx.run_blocking(type(self).parse, body)
        self.write_json(await pooled_answer(self.ctx, call, self.answer, self.engine_id, t0, keep_alive=keep_alive))
        return True


async def pooled_answer(ctx: Any, call: PoolCall, answer: Answer, request_id: str, t0: float,
                        batch: bool = False, keep_alive: float | None = None) -> dict[str, Any]:
    """The route's answer to ``call``: its model (loaded on demand, held while it runs), the serving core's
    run (serving/pooling_calls.py), the route's encoder (``answer``)."""
    catalog = ctx.catalog
    if catalog is None:
        raise UnhealthyError("the model catalog is still loading")
    target = await ctx.hold(call.model, keep_alive)  # loaded on demand through the one door (serving/model_lookup)
    try:
        if target.adapter_id is not None:
            raise ValidationError(f"Parameter model must name a base model for {call.task} requests, got the "
                                  f"LoRA adapter {call.model!r} (adapters apply to generation only)")
        got = await run_pool(ctx.frontend, target.engine, call.task, call.items, pairs=call.pairs,
                             request_id=request_id, t0=t0, dimensions=call.dimensions, batch=batch)
    finally:
        catalog.release(target)
    return answer(call, got.vectors, got.num_prompt_tokens)


def embeddings_line(ctx: Any) -> LineFn:
    """/v1/embeddings as an OpenAI batch's endpoint (jobs.batch_lines.BatchEndpoints): the route's parser, run and
    answer, at batch terms (no admission slot, the batch's window)."""
    async def run(call: LineCall) -> LineReply:
        try:
            pc = parse_embeddings(call.body)
            body = await pooled_answer(ctx, pc, embeddings_answer, call.request_id, time.monotonic(), batch=True)
            return LineReply(200, body)
        except MindieError as e:
            return LineReply(*openai_error(e))
    return run


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

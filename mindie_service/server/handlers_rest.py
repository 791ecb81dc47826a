"""The seed REST API: POST /api/generate-one (text/plain, streamed as raw chunks) and /api/generate-batch
(a JSON list in request order), through the serving core (mindie_service.serving): admission, input
processing, the engine's events under tokenTimeout/e2eTimeout, metrics.

A ``request_id`` is the client's key: at most one request runs per key (a second gets 409), and with
an engine that keeps sessions, a key whose earlier generation finished continues it."""
from __future__ import annotations

import itertools
import logging
import os
from contextlib import aclosing

from tornado.iostream import StreamBufferFullError, StreamClosedError

from mindie_service.engine.contract import EngineRequest
from mindie_service.errors import MindieError
from mindie_service.generation_config import GenerationConfig
from mindie_service.inputs.types import TextPrompt
from mindie_service.params.keep_alive import take_keep_alive
from mindie_service.protocol.rest import RestRequest, parse_generate_batch, parse_generate_one, parse_rest_body
from mindie_service.server.generation import StreamingHandler
from mindie_service.serving import Run, RequestTally, Submission

logger = logging.getLogger(__name__)

_ids = itertools.count(1)
_PREFIX = f"api-{os.getpid():x}"


class _RestHandler(StreamingHandler):
    """Shared by both routes: parse, then one serving-core call whose session keys are the request ids."""

    def parse_rest(self, body: dict, defaults: GenerationConfig) -> RestRequest:
        raise NotImplementedError

    def _defaults(self) -> GenerationConfig:
        return GenerationConfig().merged(self.ctx.config.generation_defaults)

    def _parse(self) -> tuple[RestRequest, float | None]:
        body = parse_rest_body(self.body())
        keep_alive = take_keep_alive(body)  # Ollama's keep_alive, as on every generation route
        return self.parse_rest(body, self._defaults()), keep_alive

    async def post(self) -> None:
        with self.frontend.tally() as tally:
            tally.ok = await self.serve(self._generate(tally))

    async def _generate(self, tally: RequestTally) -> bool:
        req, keep_alive = await self.ctx.run_blocking(self._parse)
        await self.hold_model(None, keep_alive)  # the default model, loaded on demand
        n = len(req.prompts)
        tally.count(n)  # a batch counts as that many requests, in admission and in metrics
        sub = Submission([TextPrompt(p.prompt) for p in req.prompts], req.params(), self.held_engine,
                         [f"{_PREFIX}-{next(_ids)}" for _ in req.prompts],
                         session_ids=[p.request_id for p in req.prompts], slots=n)
        async with self.frontend.open(sub, tally.t0) as run:
            self.run = run
            return await self._answer(req, run)

    async def _answer(self, req: RestRequest, run: Run) -> bool:
        raise NotImplementedError

    @staticmethod
    def _prefix(req: RestRequest, run: Run, ereq: EngineRequest) -> str:
        """only_new_tokens false: the prompt as the model saw it (a continuation: the whole session so far)."""
        if req.only_new_tokens:
            return ""
        return run.engine.detokenize(list(ereq.prompt_token_ids))


class GenerateOneHandler(_RestHandler):
    """POST /api/generate-one -> text/plain; streamed as HTTP chunks of whole UTF-8 characters."""

    def parse_rest(self, body: dict, defaults: GenerationConfig) -> RestRequest:
        return parse_generate_one(body, defaults)

    async def _answer(self, req: RestRequest, run: Run) -> bool:
        ereq = run.requests[0]
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        # Not streamed, or beam search (the chosen beam is sent once, as one chunk, when chosen).
        if not req.stream or req.config.num_beams > 1:
            text = (await run.fold(run.samples[0])).text
            body = (self._prefix(req, run, ereq) + text).encode("utf-8")
            if not req.stream:
                self.finish(body)
                return True
            self.write(body)
            await self.flush()
            return True
        self.start_stream("text/plain; charset=utf-8")
        started = False
        try:
            with self.bounded_output():  # a client that does not read: aborted past maxStreamBufferBytes
                async with aclosing(run.events()) as events:
                    head = self._prefix(req, run, ereq)
                    async for _, ev in events:
                        # The detokenizer never emits half a character, so each chunk is whole UTF-8.
                        chunk, head = head + ev.text_delta, ""
                        if chunk:
                            started = True
                            self.send(chunk.encode("utf-8"))
        except StreamClosedError:
            return self.client_left()
        except StreamBufferFullError:  # the engine's generator is closed already: the request is aborted
            return self.drop_slow_client()
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

    async def _answer(self, req: RestRequest, run: Run) -> bool:
        # Every prompt is handed to the engine at once, so they are scheduled into the same batch.
        results = await run.results()
        out = []
        for p, ereq, result in zip(req.prompts, run.requests, results):
            item = {"request_id": p.request_id}
            if not req.only_new_tokens:
                item["prompt"] = self._prefix(req, run, ereq)
            item["response"] = result.text
            out.append(item)
        self.write_json(out)
        return True

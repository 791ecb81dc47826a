"""The Responses API apart from HTTP: foreground responses (whole or streamed), background ones (a task that
records every token with its events in the store), cancel, the resumable event stream, and the restart.

A background response records each token (id and text delta) with the events it caused in one transaction
(storage.responses_store). After a restart (``resume_all``) the recorded deltas are fed again through a fresh
``ResponseGen`` without sending anything, which brings its event numbering to exactly where the record
stops; generation then goes on from the recorded tokens: as a continuation (the prompt and the recorded
output as the new prompt, the output cap less what was made) or, where a grammar constrains the output, by
running a greedy request again from its prompt and checking the recorded tokens as they come back (a sampled
constrained response cannot be resumed and ends ``failed``, saying so)."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

from mindie_service.engine.client import EngineClient
from mindie_service.engine.contract import EngineRequest
from mindie_service.errors import GenerationError, MindieError, NotFoundError, ValidationError
from mindie_service.inputs.types import TokensPrompt
from mindie_service.protocol.responses_encoder import TERMINAL
from mindie_service.protocol.responses_events import Event
from mindie_service.protocol.responses_input import stored_items
from mindie_service.protocol.responses_request import ResponsesRequest
from mindie_service.serving.frontend import Frontend, Submission
from mindie_service.serving.streams import Run
from mindie_service.serving.responses_gen import ResponseGen
from mindie_service.serving.responses_lease import CANCEL_CHECK_EVERY, LEASE_S, new_runner, runner_dead
from mindie_service.storage.responses_store import ResponsesStore, StoredResponse

logger = logging.getLogger(__name__)

POLL_S = 0.5  # a stream reader's wait for events another replica (or a resumed task) records


def new_response_id() -> str:
    """``resp_`` + 48 hex digits from the OS's CSPRNG: unguessable."""
    return "resp_" + secrets.token_hex(24)


@dataclass
class Prepared:
    """A parsed call and the engine serving it (``release`` when done: the catalog holds the model)."""

    req: ResponsesRequest
    engine: EngineClient
    release: Callable[[], None] = lambda: None


PrepareFn = Callable[[dict[str, Any], list[dict[str, Any]], str], Awaitable[Prepared]]


@dataclass(frozen=True)
class Resume:
    """Where a background response cut by a restart goes on from."""

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    started: bool  # response.in_progress was recorded already


def held_back_dropped(store: ResponsesStore, rid: str) -> list[tuple[int, str, str]]:
    """The recorded tokens a resume goes on from: without the trailing ones whose text was still held back (half a
    UTF-8 character): a continuation decodes its output apart from its prompt, so those bytes would never be
    completed. They made no event; the resumed generation makes them again and records them then."""
    tokens = store.tokens(rid)
    keep = len(tokens)
    while keep > 0 and tokens[keep - 1][1] == "" and tokens[keep - 1][2] == "":
        keep -= 1
    if keep < len(tokens):
        store.drop_tokens(rid, keep)
    return tokens[:keep]


def kept_session(rid: str, p: Prepared) -> list[str | None]:
    """A stored response runs as the engine's session ``rid`` (a fresh key: never a continuation): the finished
    conversation's KV blocks stay pinned in the prefix cache (within the sessions' bounds) and spill to disk on
    a drain, so the ``previous_response_id`` turn finds its prompt's KV there instead of recomputing it."""
    return [rid if p.req.options.store else None]


class ResponsesService:
    def __init__(self, store: ResponsesStore, frontend: Frontend, prepare: PrepareFn) -> None:
        self.store, self.frontend, self.prepare = store, frontend, prepare
        self.live: dict[str, tuple[asyncio.Task[None], ResponseGen]] = {}
        self._wake: dict[str, asyncio.Event] = {}
        self.runner = new_runner()  # this process, as the rows of the responses it generates name it
        self._waiting: set[asyncio.Task[None]] = set()  # responses another live process runs (``_take_over``)

    # ------------------------------------------------------------ helpers
    def history(self, prev: str | None, owner: str) -> list[dict[str, Any]]:
        """The stored conversation ``previous_response_id`` continues (404 when absent or another key's)."""
        if prev is None:
            return []
        row = self.store.get(prev, owner)
        if row is None:
            raise NotFoundError(f"Parameter previous_response_id names no stored response: {prev!r}")
        if row.status in ("queued", "in_progress"):
            raise ValidationError(f"Parameter previous_response_id names a response still {row.status}: {prev!r}")
        return row.conversation()

    def _submission(self, gen: ResponseGen, p: Prepared, prompt_ids: tuple[int, ...] | None = None,
                    batch: bool = False) -> Submission:
        """The call's submission: its prompt, or (a greedy constrained response resumed) its recorded prompt;
        ``batch``: a batch line's (below online traffic)."""
        chat = p.req.chat
        if prompt_ids is not None:
            return Submission([TokensPrompt(prompt_ids)], chat.params, lambda: p.engine, [gen.id], rank=chat.rank)
        return Submission([chat.prompt], chat.params, lambda: p.engine, [gen.id], truncate=chat.truncate,
                          session_ids=kept_session(gen.id, p), rank=chat.rank, batch=batch)

    def _open(self, gen: ResponseGen, p: Prepared, resume: Resume | None, ereq: EngineRequest | None) -> Any:
        """The generation's Run: of ``ereq`` (made when the response was created), a fresh one, or after a
        restart the continuation of the recorded tokens (the prompt and the output so far as the prompt, the
        output cap less what was made; it passed the input rules when first made, so it goes to the engine as
        it is). A constrained response runs again."""
        t0 = time.monotonic()
        if ereq is not None:
            return self.frontend.open_prepared(p.engine, [ereq], t0)
        if resume is None or not resume.output_ids:
            return self.frontend.open(self._submission(gen, p), t0)
        params = p.req.chat.params
        if params.structured_outputs is not None:
            return self.frontend.open(self._submission(gen, p, resume.prompt_ids), t0)
        params = dataclasses.replace(params, max_tokens=max(1, params.max_tokens - len(resume.output_ids)))
        ereq = EngineRequest(gen.id, resume.prompt_ids + resume.output_ids, params, rank=p.req.chat.rank)
        return self.frontend.open_prepared(p.engine, [ereq], t0)

    def _save(self, gen: ResponseGen, owner: str, context: list[dict[str, Any]], background: bool) -> None:
        req = gen.state.req
        if req.options.store:
            self.store.create(gen.id, owner, req.body, context, stored_items(list(req.items), gen.id[5:29]),
                              gen.json(), background, self.runner if background else "")

    def _notify(self, rid: str) -> None:
        ev = self._wake.pop(rid, None)
        if ev is not None:
            ev.set()

    # ------------------------------------------------------------ foreground
    async def whole(self, p: Prepared, owner: str, context: list[dict[str, Any]], t0: float,
                    watch: Callable[[Run], None] = lambda run: None, batch: bool = False) -> dict[str, Any]:
        """``watch``: told the Run once it is open (the access log reads its usage); ``batch``: a batch line."""
        gen = ResponseGen(new_response_id(), p.req)
        async with self.frontend.open(self._submission(gen, p, batch=batch), t0) as run:
            watch(run)
            results = await run.results()
        gen.start()
        gen.whole(results[0])
        self._save(gen, owner, context, False)
        return gen.json()

    async def stream(self, p: Prepared, owner: str, context: list[dict[str, Any]], t0: float,
                     watch: Callable[[Run], None] = lambda run: None) -> AsyncIterator[list[Event]]:
        """Batches of events; an error before the first batch is raised (nothing was sent), one after it ends
        the stream with ``error`` and response.failed."""
        gen = ResponseGen(new_response_id(), p.req)
        async with self.frontend.open(self._submission(gen, p), t0) as run:
            watch(run)
            yield gen.start()
            try:
                async with aclosing(run.events()) as events:
                    async for _, ev in events:
                        yield gen.token(ev)
            except MindieError as err:
                logger.info("%s: error after the stream started: %s", gen.id, err.message)
                yield gen.fail(err)
            finally:
                if gen.state.status in TERMINAL:
                    self._save(gen, owner, context, False)

    # ------------------------------------------------------------ background
    async def submit(self, p: Prepared, owner: str, context: list[dict[str, Any]]) -> dict[str, Any]:
        """Check and tokenize the prompt now (a bad one is the create call's 400, not a failed response),
        store the response ``queued`` with its response.created event and start it; its object now."""
        gen = ResponseGen(new_response_id(), p.req)
        chat = p.req.chat
        ereq = await self.frontend.engine_request(p.engine, chat.prompt, chat.params, gen.id, truncate=chat.truncate,
                                                  session_id=kept_session(gen.id, p)[0])
        ereq = dataclasses.replace(ereq, rank=chat.rank)
        evs = gen.start(queued=True)
        self._save(gen, owner, context, True)
        self.store.record(gen.id, [], evs)
        self._spawn(gen, p, None, ereq)
        return gen.json()

    def _spawn(self, gen: ResponseGen, p: Prepared, resume: Resume | None, ereq: EngineRequest | None = None) -> None:
        task = asyncio.get_running_loop().create_task(self._background(gen, p, resume, ereq),
                                                      name=f"response-{gen.id}")
        self.live[gen.id] = (task, gen)

        def done(_t: asyncio.Task[None]) -> None:
            self.live.pop(gen.id, None)
            p.release()
            self._notify(gen.id)
        task.add_done_callback(done)

    async def _background(self, gen: ResponseGen, p: Prepared, resume: Resume | None,
                          ereq: EngineRequest | None) -> None:
        rid = gen.id
        try:
            if resume is None or not resume.started:
                self.store.record(rid, [], gen.running(), gen.json())
                self._notify(rid)
            await self._generate(gen, p, resume, ereq)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a broken response fails alone
            err = e if isinstance(e, MindieError) else GenerationError(f"Response {rid} failed during generation")
            if not isinstance(e, MindieError):
                logger.exception("%s: background response failed", rid)
            self.store.record(rid, [], gen.fail(err), gen.json())
            self._notify(rid)

    async def _generate(self, gen: ResponseGen, p: Prepared, resume: Resume | None,
                        ereq: EngineRequest | None) -> None:
        rid, done = gen.id, 0 if resume is None else len(resume.output_ids)
        rerun = resume is not None and bool(resume.output_ids) and p.req.chat.params.structured_outputs is not None
        async with self._open(gen, p, resume, ereq) as run:
            prompt_ids = list(run.requests[0].prompt_token_ids)
            async with aclosing(run.events()) as events:
                async for _, ev in events:
                    if rerun and resume is not None and ev.index < done:
                        if ev.token.id != resume.output_ids[ev.index]:
                            raise GenerationError(f"Response {rid} could not resume: the output differs from "
                                                  "the one recorded before the restart")
                        continue
                    first = gen.count == 0
                    evs = gen.token(ev)
                    prompt = ({"ids": prompt_ids, "input": gen.usage.input, "cached": gen.usage.cached}
                              if first else None)
                    self.store.record(rid, [(gen.count - 1, ev.token.id, ev.text_delta, ev.reasoning_delta)], evs,
                                      gen.json() if ev.finish_reason is not None else None, prompt)
                    self._notify(rid)
                    if gen.count % CANCEL_CHECK_EVERY == 0 and self.store.status(rid) == "cancelled":
                        return  # cancelled through another replica: leaving aborts the engine's request

    async def cancel(self, rid: str, owner: str) -> dict[str, Any]:
        """Cancel a background response: it ends ``cancelled`` and its sequence is freed now. A finished one
        is answered as it is; a foreground response cannot be cancelled (400)."""
        row = self._row(rid, owner)
        if not row.background:
            raise ValidationError("Responses can only be cancelled if they were created with background=true")
        if row.status in TERMINAL:
            return row.response
        live = self.live.get(rid)
        body = live[1].cancelled() if live is not None else {**row.response, "status": "cancelled"}
        self.store.update(rid, body)
        if live is not None:
            live[0].cancel()  # closes its events: the engine aborts the request and frees its blocks
            await asyncio.gather(live[0], return_exceptions=True)
        self._notify(rid)
        return body

    def _row(self, rid: str, owner: str) -> StoredResponse:
        row = self.store.get(rid, owner)
        if row is None:
            raise NotFoundError(f"no stored response {rid!r}")
        return row

    def get(self, rid: str, owner: str) -> dict[str, Any]:
        return self._row(rid, owner).response

    def delete(self, rid: str, owner: str) -> dict[str, Any]:
        if rid in self.live and self.store.get(rid, owner) is not None:
            raise ValidationError(f"response {rid!r} is still running; cancel it first")
        if not self.store.delete(rid, owner):
            raise NotFoundError(f"no stored response {rid!r}")
        return {"id": rid, "object": "response", "deleted": True}

    def items(self, rid: str, owner: str) -> list[dict[str, Any]]:
        return self._row(rid, owner).items

    # ------------------------------------------------------------ the recorded stream
    async def events(self, rid: str, owner: str, after: int) -> AsyncIterator[Event]:
        """The recorded events numbered above ``after``, then the new ones as they are recorded, until the
        response ends (from any replica sharing the store)."""
        row = self._row(rid, owner)
        if not (row.background and row.body.get("stream") is True):
            raise ValidationError("Only responses created with background=true and stream=true can be streamed")
        last = after
        while True:
            status = self._row(rid, owner).status
            evs = self.store.events(rid, last)
            for e in evs:
                yield e
                last = e["sequence_number"]
            if evs:
                continue
            if status in TERMINAL:
                return
            wake = self._wake.setdefault(rid, asyncio.Event())
            try:
                await asyncio.wait_for(wake.wait(), POLL_S)
            except asyncio.TimeoutError:
                pass

    # ------------------------------------------------------------ restart
    async def shutdown(self) -> None:
        """Stop every background response where it is (still in progress in the store: the next start resumes
        it)."""
        tasks = [t for t, _ in self.live.values()] + list(self._waiting)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def resume_all(self) -> int:
        """Go on with every background response a restart cut (one no live process runs: serving.responses_lease);
        how many were found."""
        rows = self.store.unfinished()
        for row in rows:
            if self._claim(row.id):
                await self._resume(row)
            else:  # another live process runs it: take over only if it falls silent
                task = asyncio.get_running_loop().create_task(self._take_over(row.id))
                self._waiting.add(task)
                task.add_done_callback(self._waiting.discard)
        return len(rows)

    def _claim(self, rid: str) -> bool:
        return self.store.claim(rid, self.runner, time.time() - LEASE_S, runner_dead)

    async def _take_over(self, rid: str) -> None:
        while self.store.status(rid) in ("queued", "in_progress"):
            await asyncio.sleep(LEASE_S / 2)
            row = self.store.get_any(rid)
            if row is not None and self._claim(rid):
                await self._resume(row)
                return

    async def _resume(self, row: StoredResponse) -> None:
        try:
            p = await self.prepare(row.body, row.context, row.id)
        except MindieError as e:
            logger.warning("%s: cannot resume after the restart: %s", row.id, e.message)
            self.store.update(row.id, {**row.response, "status": "failed",
                                       "error": {"code": "server_error", "message": e.message}})
            return
        gen = ResponseGen(row.id, p.req, created_at=row.created)
        gen.start(queued=True)
        started = row.status == "in_progress"
        if started:
            gen.running()
        tokens = held_back_dropped(self.store, row.id)
        if tokens and row.prompt:
            gen.prompt(row.prompt["input"], row.prompt["cached"])
        for _tid, delta, thought in tokens:  # the events these made are recorded: numbering only
            gen.replay(delta, thought)
        recorded = self.store.last_seq(row.id)
        if gen.emitter.seq != recorded + 1:
            logger.warning("%s: replay numbered %d events, %d recorded", row.id, gen.emitter.seq, recorded + 1)
            gen.emitter.seq = recorded + 1
        resume = Resume(tuple(row.prompt["ids"]) if row.prompt else (), tuple(t for t, _, _ in tokens), started)
        if tokens and p.req.chat.params.structured_outputs is not None and p.req.chat.sampling:
            self.store.record(row.id, [], gen.fail(GenerationError(
                "a sampled constrained response cut by a restart cannot resume (its grammar state is not kept)")),
                gen.json())
            p.release()
            return
        logger.info("%s: resuming after the restart at output token %d", row.id, len(tokens))
        self._spawn(gen, p, resume)

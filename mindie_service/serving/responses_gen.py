"""One response's generation as events: the lifecycle around the output emitter (protocol.responses_events).

``ResponseGen`` turns engine events (or a folded result) into the Responses API's numbered events and keeps
the response object in step: ``start`` (response.created, response.in_progress), ``token`` (the items'
events), ``end`` (the items closed, then response.completed or response.incomplete), ``fail``
(response.failed). Foreground and background responses, streamed or whole, all go through it."""
from __future__ import annotations

import time
from typing import Any

from mindie_service.engine.contract import FINISH_LENGTH, TokenEvent, TokenInfo
from mindie_service.errors import MindieError
from mindie_service.protocol.request import GenerationResult
from mindie_service.protocol.responses_encoder import FINAL_EVENTS, ResponseState, Usage, error_event, failed_error
from mindie_service.protocol.responses_events import Event, ResponseEmitter
from mindie_service.protocol.responses_request import ResponsesRequest


class ResponseGen:
    def __init__(self, rid: str, req: ResponsesRequest, created_at: float | None = None) -> None:
        self.state = ResponseState(rid, req, created_at=time.time() if created_at is None else created_at)
        chat = req.chat
        self.emitter = ResponseEmitter(rid, chat.tools, chat.logprobs if chat.logprobs is not None else None)
        self.usage = Usage()
        self.state.usage = None
        self.count = 0  # output tokens seen

    @property
    def id(self) -> str:
        return self.state.id

    def json(self) -> dict[str, Any]:
        return self.state.json()

    def start(self, queued: bool = False) -> list[Event]:
        """response.created (``queued`` for a background response) and, unless queued, response.in_progress."""
        self.state.status = "queued" if queued else "in_progress"
        evs = [self.emitter.event("response.created", response=self.json())]
        return evs if queued else evs + self.running()

    def running(self) -> list[Event]:
        self.state.status = "in_progress"
        return [self.emitter.event("response.in_progress", response=self.json())]

    def prompt(self, num_prompt: int, cached: int) -> None:
        self.usage.input, self.usage.cached = num_prompt, cached

    def token(self, ev: TokenEvent) -> list[Event]:
        """The events of one engine event (the last closes the response)."""
        if self.count == 0 and ev.num_prompt_tokens:
            self.prompt(ev.num_prompt_tokens, ev.num_cached_tokens)
        if ev.finish_reason is not None:
            self.usage.reasoning = ev.reasoning_tokens
        return self.text(ev.text_delta, [ev.token], ev.finish_reason, ev.reasoning_delta)

    def text(self, delta: str, tokens: list[TokenInfo], finish_reason: str | None, thought: str = "") -> list[Event]:
        self.count += len(tokens)
        evs = self.emitter.feed(delta, tokens, final=finish_reason is not None, thought=thought)
        return evs + self.end(finish_reason) if finish_reason is not None else evs

    def replay(self, delta: str, thought: str = "") -> None:
        """A recorded token fed again after a restart: its events were recorded, so they are dropped (only the
        numbering and the items move on)."""
        self.count += 1
        self.emitter.feed(delta, thought=thought)

    def whole(self, result: GenerationResult) -> list[Event]:
        """A folded result fed at once (the non-streamed response: the same emitter, so the same items)."""
        self.prompt(result.num_prompt_tokens, result.num_cached_tokens)
        self.usage.reasoning = result.reasoning_tokens
        return self.text(result.text, result.tokens, result.finish_reason or "stop", result.reasoning)

    def end(self, finish_reason: str) -> list[Event]:
        status = "incomplete" if finish_reason == FINISH_LENGTH else "completed"
        evs = self.emitter.finish(status)
        self.usage.output = self.count
        s = self.state
        s.status, s.output, s.usage, s.completed_at = status, self.emitter.output(), self.usage, time.time()
        return evs + [self.emitter.event(FINAL_EVENTS[status], response=self.json())]

    def fail(self, err: MindieError) -> list[Event]:
        """The ``error`` event and response.failed (a stream's end when generation failed)."""
        s = self.state
        s.status, s.error, s.output = "failed", failed_error(err), self.emitter.output()
        self.usage.output = self.count
        s.usage = self.usage
        evs = [error_event(err, self.emitter.seq)]
        self.emitter.seq += 1
        return evs + [self.emitter.event("response.failed", response=self.json())]

    def cancelled(self) -> dict[str, Any]:
        s = self.state
        s.status, s.output = "cancelled", self.emitter.output()
        self.usage.output = self.count
        s.usage = self.usage
        return self.json()

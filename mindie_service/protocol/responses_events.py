"""A response's output items and OpenAI's typed stream events, from one emitter fed the generated text.

``ResponseEmitter.feed(text)`` takes each text delta (or the whole text at once) through the chat route's one
tool-call parser (protocol.tool_parser) and returns the events it causes, each numbered by ``sequence_number``
(rising by one from 0). The whole (non-streamed) response is the same emitter fed the whole text, so the two
cannot disagree: the items depend on the text, never on where a chunk ended.

Items: ``message`` (one ``output_text`` part, ``annotations: []``), ``function_call`` (``call_id``, ``name``,
``arguments``) and ``reasoning`` (the thinking a reasoning split parsed apart from the answer: one
``reasoning_text`` part; ``summary`` is empty: nothing here summarizes). Events:
``response.output_item.added`` / ``.done``, ``response.content_part.added`` / ``.done``,
``response.output_text.delta`` / ``.done``, ``response.reasoning_text.delta`` / ``.done``,
``response.function_call_arguments.delta`` / ``.done``; the response-level ones (created, in_progress, completed,
incomplete, failed, error) are ``lifecycle``'s."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from mindie_service.engine.contract import TokenInfo
from mindie_service.protocol.tool_calls import ToolsRequest
from mindie_service.protocol.tool_parser import ToolCallParser

Event = dict[str, Any]


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8", errors="replace"))


def logprob_json(t: TokenInfo, k: int) -> dict[str, Any]:
    """An ``output_text`` logprob (the delta events carry the same, their ``bytes`` aside)."""
    lp = -9999.0 if t.logprob is None else max(t.logprob, -9999.0)
    return {"token": t.text, "bytes": _bytes(t.text), "logprob": lp,
            "top_logprobs": [{"token": a.text, "bytes": _bytes(a.text), "logprob": max(a.logprob or 0.0, -9999.0)}
                             for a in t.top[:k]]}


@dataclass
class OutputItem:
    """One output item as it grows: a message's text, a call's arguments, a reasoning item's text."""

    kind: str  # message | function_call | reasoning
    id: str
    text: str = ""
    name: str = ""
    call_id: str = ""
    status: str = "in_progress"
    logprobs: list[dict[str, Any]] | None = None

    def json(self) -> dict[str, Any]:
        if self.kind == "function_call":
            return {"id": self.id, "type": "function_call", "status": self.status, "call_id": self.call_id,
                    "name": self.name, "arguments": self.text}
        if self.kind == "reasoning":
            return {"id": self.id, "type": "reasoning", "status": self.status, "summary": [],
                    "content": [self.part()] if self.status != "in_progress" else []}
        return {"id": self.id, "type": "message", "status": self.status, "role": "assistant",
                "content": [self.part()] if self.status != "in_progress" else []}

    def part(self) -> dict[str, Any]:
        if self.kind == "reasoning":
            return {"type": "reasoning_text", "text": self.text}
        out: dict[str, Any] = {"type": "output_text", "text": self.text, "annotations": []}
        if self.logprobs is not None:
            out["logprobs"] = self.logprobs
        return out


@dataclass
class ResponseEmitter:
    """Text in, items and numbered events out. ``tools``: the call's tools (None or inactive: plain text);
    ``top_logprobs``: None without logprobs, else the alternatives per token."""

    response_id: str
    tools: ToolsRequest | None = None
    top_logprobs: int | None = None
    seq: int = 0  # the next event's sequence_number
    items: list[OutputItem] = field(default_factory=list)
    _open: OutputItem | None = None
    _parser: ToolCallParser | None = None
    _pending: list[dict[str, Any]] = field(default_factory=list)  # logprobs not yet sent with a text delta

    def __post_init__(self) -> None:
        if self.tools is not None and self.tools.active:
            self._parser = ToolCallParser(self.tools.fmt, id_prefix=f"call_{self.response_id[-16:]}_")

    def event(self, kind: str, **body: Any) -> Event:
        ev = {"type": kind, "sequence_number": self.seq, **body}
        self.seq += 1
        return ev

    def _item_id(self, prefix: str) -> str:
        return f"{prefix}_{self.response_id[5:]}{len(self.items):03d}"

    # -- items -------------------------------------------------------------------------------------
    def _close(self, status: str) -> list[Event]:
        it, self._open = self._open, None
        if it is None:
            return []
        it.status = status
        k = len(self.items) - 1
        if it.kind == "function_call":
            evs = [self.event("response.function_call_arguments.done", item_id=it.id, output_index=k,
                              arguments=it.text, name=it.name)]
        elif it.kind == "reasoning":
            evs = [self.event("response.reasoning_text.done", item_id=it.id, output_index=k, content_index=0,
                              text=it.text),
                   self.event("response.content_part.done", item_id=it.id, output_index=k, content_index=0,
                              part=it.part())]
        else:
            if it.logprobs is not None:
                it.logprobs += self._pending
                self._pending = []
            lp = it.logprobs if it.logprobs is not None else []
            evs = [self.event("response.output_text.done", item_id=it.id, output_index=k, content_index=0,
                              text=it.text, logprobs=lp),
                   self.event("response.content_part.done", item_id=it.id, output_index=k, content_index=0,
                              part=it.part())]
        return evs + [self.event("response.output_item.done", output_index=k, item=it.json())]

    def _add(self, it: OutputItem) -> list[Event]:
        self.items.append(it)
        self._open = it
        k = len(self.items) - 1
        evs = [self.event("response.output_item.added", output_index=k, item=it.json())]
        if it.kind in ("message", "reasoning"):
            part = {"type": "reasoning_text", "text": ""} if it.kind == "reasoning" else \
                {"type": "output_text", "text": "", "annotations": []}
            evs.append(self.event("response.content_part.added", item_id=it.id, output_index=k, content_index=0,
                                  part=part))
        return evs

    def _thought(self, text: str) -> list[Event]:
        """Thinking text: into the open reasoning item (opened now, closing the item before it, if none is open)."""
        evs: list[Event] = []
        if self._open is None or self._open.kind != "reasoning":
            evs = self._close("completed") + self._add(OutputItem("reasoning", self._item_id("rs")))
        it = self._open
        assert it is not None
        it.text += text
        evs.append(self.event("response.reasoning_text.delta", item_id=it.id, output_index=len(self.items) - 1,
                              content_index=0, delta=text))
        return evs

    def _text_open(self) -> list[Event]:
        """The open message item (opened now, closing the item before it, if none is open)."""
        if self._open is not None and self._open.kind == "message":
            return []
        return self._close("completed") + self._add(OutputItem("message", self._item_id("msg"),
                                                               logprobs=[] if self.top_logprobs is not None else None))

    def _text(self, text: str) -> list[Event]:
        evs = self._text_open()
        it = self._open
        assert it is not None
        it.text += text
        lp: list[dict[str, Any]] = []
        if it.logprobs is not None:
            lp, self._pending = self._pending, []
            it.logprobs += lp
        evs.append(self.event("response.output_text.delta", item_id=it.id, output_index=len(self.items) - 1,
                              content_index=0, delta=text, logprobs=[{k: v for k, v in x.items() if k != "bytes"}
                                                                     for x in lp]))
        return evs

    def _call(self, call_id: str | None, name: str | None, args: str) -> list[Event]:
        evs: list[Event] = []
        if call_id is not None:
            evs += self._close("completed")
            evs += self._add(OutputItem("function_call", self._item_id("fc"), name=name or "", call_id=call_id))
        it = self._open
        if args and it is not None and it.kind == "function_call":
            it.text += args
            evs.append(self.event("response.function_call_arguments.delta", item_id=it.id,
                                  output_index=len(self.items) - 1, delta=args))
        return evs

    # -- the text --------------------------------------------------------------------------------
    def feed(self, text: str, tokens: Sequence[TokenInfo] = (), final: bool = False,
             thought: str = "") -> list[Event]:
        """The events ``text`` (the next answer delta; ``thought``: the thinking delta before it; ``tokens``: those
        that made them) causes."""
        if self.top_logprobs is not None:
            self._pending += [logprob_json(t, self.top_logprobs) for t in tokens]
        evs: list[Event] = self._thought(thought) if thought else []
        if self._parser is None:
            return evs + (self._text(text) if text else [])
        for x in self._parser.feed_ordered(text, final=final):  # an item for each run, in the text's order
            evs += self._text(x) if isinstance(x, str) else self._call(x.id, x.name, x.arguments)
        return evs

    def finish(self, status: str) -> list[Event]:
        """Close the open item: ``completed``, or ``incomplete`` when the output cap cut it. An answer with no
        text and no call still has its (empty) message, as chat's has ``content: ""``."""
        if status == "incomplete" and self._open is not None and self._open.kind == "reasoning":
            return self._close("incomplete")  # cut while thinking: no answer yet, as OpenAI's (no message item)
        evs = [] if any(it.kind != "reasoning" for it in self.items) else self._text_open()
        return evs + self._close("incomplete" if status == "incomplete" else "completed")

    @property
    def called(self) -> bool:
        return any(it.kind == "function_call" for it in self.items)

    def output(self) -> list[dict[str, Any]]:
        return [it.json() for it in self.items]

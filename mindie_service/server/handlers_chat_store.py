"""OpenAI's stored chat completions on the business port (a chat call with ``store: true`` is kept by
storage.chat_store; server/handlers_openai.ChatCompletionsHandler stores it):

    GET    /v1/chat/completions                     the caller's stored completions: model, metadata[k]=v filters,
                                                    after / limit / order pages, as OpenAI's list
    GET    /v1/chat/completions/{id}                one, with its metadata
    POST   /v1/chat/completions/{id}                {"metadata": {...}}: replaces its metadata
    DELETE /v1/chat/completions/{id}
    GET    /v1/chat/completions/{id}/messages       the request's messages (after / limit / order)

Errors in OpenAI's shape; a completion belongs to the API key that made it (server.responses_prepare.owner_of)."""
from __future__ import annotations

import re
from typing import Any

from mindie_service.errors import MindieError, NotFoundError, ValidationError, check
from mindie_service.protocol.openai_encoder import openai_error
from mindie_service.protocol.openai_fields import metadata
from mindie_service.server.handlers_base import BaseHandler
from mindie_service.server.responses_prepare import owner_of
from mindie_service.storage.chat_store import ChatCompletionStore, ListQuery, StoredCompletion

_META = re.compile(r"^metadata\[([^\]]{1,64})\]$")


class _StoreHandler(BaseHandler):
    def error_json(self, err: MindieError) -> Any:
        status, body = openai_error(err)
        self.set_status(status)
        return body

    @property
    def store(self) -> ChatCompletionStore:
        return self.ctx.chat_store()

    def stored(self, cid: str) -> StoredCompletion:
        row = self.store.get(cid, owner_of(self))
        if row is None:
            raise NotFoundError(f"no stored chat completion {cid!r}")
        return row


def page_args(h: BaseHandler) -> tuple[str | None, int, str]:
    after = h.get_query_argument("after", None)
    limit = h.get_query_argument("limit", "20")
    check(limit.isdigit() and 1 <= int(limit) <= 100, "limit", "an integer in [1, 100]", limit)
    order = h.get_query_argument("order", "asc")
    check(order in ("asc", "desc"), "order", "asc or desc", order)
    return after, int(limit), order


def _page(data: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}


def list_stored(h: BaseHandler) -> None:
    """GET /v1/chat/completions (served by the chat route's handler: one path, POST creates, GET lists)."""
    after, limit, order = page_args(h)
    meta: list[tuple[str, str]] = []
    for name in h.request.query_arguments:
        m = _META.match(name)
        if m:
            meta.append((m.group(1), h.get_query_argument(name)))
        elif name not in ("after", "limit", "order", "model"):
            raise ValidationError(f"Parameter {name} is not a filter of this list (it takes model, "
                                  "metadata[key], after, limit, order)")
    q = ListQuery(h.get_query_argument("model", None), tuple(meta), after, limit, order)
    rows, more = h.ctx.chat_store().list(owner_of(h), q)
    h.write_json(_page([r.json() for r in rows], more))


class StoredCompletionHandler(_StoreHandler):
    """GET / POST (metadata) / DELETE /v1/chat/completions/{id}."""

    def get(self, cid: str) -> None:
        self.write_json(self.stored(cid).json())

    def post(self, cid: str) -> None:
        body = self.json_body()
        check(isinstance(body, dict) and set(body) == {"metadata"}, "body", 'an object {"metadata": {...}}', body)
        meta = metadata(body["metadata"]) or {}
        row = self.store.set_metadata(cid, owner_of(self), meta)
        if row is None:
            raise NotFoundError(f"no stored chat completion {cid!r}")
        self.write_json(row.json())

    def delete(self, cid: str) -> None:
        if not self.store.delete(cid, owner_of(self)):
            raise NotFoundError(f"no stored chat completion {cid!r}")
        self.write_json({"object": "chat.completion.deleted", "id": cid, "deleted": True})


class StoredMessagesHandler(_StoreHandler):
    """GET /v1/chat/completions/{id}/messages."""

    def get(self, cid: str) -> None:
        after, limit, order = page_args(self)
        row = self.stored(cid)
        msgs = [{"id": f"{cid}-{i}", **m} for i, m in enumerate(row.messages)]
        seq = msgs if order == "asc" else msgs[::-1]
        if after is not None:
            ids = [m["id"] for m in seq]
            check(after in ids, "after", "the id of one of this completion's messages", after)
            seq = seq[ids.index(after) + 1:]
        self.write_json(_page(seq[:limit], len(seq) > limit))

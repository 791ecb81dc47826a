"""What the Responses routes need from the deployment: a call parsed against its model (the catalog picks the
engine, as on the chat route) and the owner of a stored response (the hash of the caller's API key)."""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from mindie_service.catalog.catalog import Target
from mindie_service.errors import UnhealthyError
from mindie_service.params.keep_alive import take_keep_alive
from mindie_service.protocol.openai import peek_model
from mindie_service.protocol.request import ProtocolLimits
from mindie_service.protocol.responses_request import parse_responses
from mindie_service.server.auth import bearer
from mindie_service.server.model_tools import tool_format
from mindie_service.serving.responses_service import Prepared


async def prepare_held(ctx: Any, body: dict[str, Any], context: list[dict[str, Any]], request_id: str) -> Prepared:
    """The model ``body`` names held (loaded on demand through the one door, with the body's ``keep_alive``),
    then ``body`` parsed for it in the tokenizer pool."""
    catalog = ctx.catalog
    if catalog is None:
        raise UnhealthyError("the model catalog is still loading")
    keep_alive = take_keep_alive(body)
    target = await ctx.hold(peek_model(body, catalog.default_id), keep_alive)
    try:
        return await ctx.run_blocking(prepare, ctx, body, context, request_id, target)  # type: ignore[no-any-return]
    except BaseException:
        catalog.release(target)
        raise


def prepare(ctx: Any, body: dict[str, Any], context: list[dict[str, Any]], request_id: str, target: Target) -> Prepared:
    """``body`` parsed for ``target``, the model it names (``context``: the stored conversation it continues); the
    model is held until ``release``. ``truncation: "auto"`` keeps the prompt's last maxInputTokenLen tokens."""
    catalog = ctx.catalog
    model = peek_model(body, catalog.default_id)
    limits = ProtocolLimits(vocab_size=target.engine.vocab_size, media_policy=ctx.media_policy)
    req = parse_responses(body, context, limits=limits, model=model, defaults=target.defaults,
                          adapter_id=target.adapter_id, request_id=request_id,
                          tool_format=tool_format(target.engine, ctx))
    if req.options.truncation == "auto":
        chat = dataclasses.replace(req.chat, truncate=ctx.config.backend.max_input_token_len)
        req = dataclasses.replace(req, chat=chat)
    return Prepared(req, target.engine, lambda: catalog.release(target))


def owner_of(handler: Any) -> str:
    """Who owns what this request stores: the SHA-256 (hex) of its API key while the business plane asks
    for keys, else "" (everyone)."""
    auth = handler.application.settings.get("auth")
    if auth is None or not auth.ring.asks("business"):
        return ""
    key = bearer(handler.request.headers.get("Authorization")) or ""
    return hashlib.sha256(key.encode("utf-8", errors="surrogatepass")).hexdigest()

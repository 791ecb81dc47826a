"""The base of every handler: body cap (413), JSON parsing (400), and the one place errors become
``{"error", "error_type"}`` responses.

Keep-alive: a request refused before its body was used (unknown route, too many headers, a body over
maxRequestLength) is answered only once its body has been read and dropped, so the connection stays
usable; answering first makes Tornado close it without ``Connection: close`` and with unread input (a
reset), which fails the client's next request on its pooled connection. A body too large to drain, and a
method Tornado refuses before any handler code runs, are answered at once with ``Connection: close``,
then the connection is drained for a while before the close (``listener.linger_close``)."""
from __future__ import annotations

import itertools
import json
import logging
import os
from typing import Any

import tornado.web
from tornado.httputil import responses
from tornado.iostream import StreamClosedError

from mindie_service.errors import (
    BadRequestError,
    IncompleteGenerationError,
    MethodNotAllowedError,
    MindieError,
    NotFoundError,
    PayloadTooLargeError,
    UnauthorizedError,
)
from mindie_service.protocol.openai_encoder import openai_error
from mindie_service.protocol.validation import parse_json_body
from mindie_service.server.auth import request_error
from mindie_service.server.context import ServerContext
from mindie_service.server.listener import drain_limit, start_linger
from mindie_service.server.tracing import trace_headers
from mindie_service.serving.observer import TRACE_HEADERS

logger = logging.getLogger(__name__)

MAX_HEADERS = 100
MAX_REQUEST_ID = 128  # the longest X-Request-Id taken from a client (printable ASCII, no spaces)
_ids = itertools.count(1)
_PREFIX = f"{os.getpid():x}"


def new_request_id() -> str:
    """A request id unique in this server's life: ``<pid in hex>-<n>``."""
    return f"{_PREFIX}-{next(_ids)}"


def client_request_id(value: str | None) -> str | None:
    """The client's ``X-Request-Id`` when it is usable (1-128 printable ASCII characters, no spaces), else None."""
    if value and len(value) <= MAX_REQUEST_ID and all(0x21 <= ord(c) <= 0x7E for c in value):
        return value
    return None


def http_error_for(status: int, message: str) -> MindieError:
    """A MindieError for a status Tornado raised itself (unknown method, malformed request...)."""
    if status == 404:
        return NotFoundError(message)
    if status == 405:
        return MethodNotAllowedError(message)
    if status == 413:
        return PayloadTooLargeError(message)
    if 400 <= status < 500:
        err: MindieError = BadRequestError(message)
        err.status = status
        return err
    return IncompleteGenerationError(message)


def error_reason(err: MindieError, limit: int = 200) -> str:
    """``error_type: message`` for the access log, cut at ``limit`` characters (a message may quote a value)."""
    text = f"{err.error_type}: {err.message}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


@tornado.web.stream_request_body
class BaseHandler(tornado.web.RequestHandler):
    """Streams the body in so that a body over ``maxRequestLength`` is counted and dropped, never kept."""

    ctx: ServerContext

    def initialize(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self._chunks: list[bytes] = []
        self._size = 0
        self._too_large = False
        self._refusal: MindieError | None = None
        self.aborted = False  # the client closed the connection before the response was finished
        self.error_reason: str | None = None  # the error answered, for the access log (server/app.log_request)

    async def _execute(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        # Counts handlers whose request is still being served (/v1/status "connections.handlers"): an
        # abandoned upload used to stay here, with the chunks it had read, until shutdown.
        self.ctx.open_handlers += 1
        if self.ctx.tracer is not None:  # the caller's trace context, for the request spans (server/tracing.py)
            TRACE_HEADERS.set(trace_headers(self.request.headers.get))
        try:
            await super()._execute(*args, **kwargs)  # type: ignore[misc]
        finally:
            self.ctx.open_handlers -= 1

    def on_connection_close(self) -> None:
        # Tornado's own method fails the body future of a @stream_request_body handler; without it an
        # abandoned upload leaves the handler (and every chunk it buffered) waiting forever.
        if not self._finished:
            self.aborted = True
        self._chunks.clear()
        super().on_connection_close()

    def set_default_headers(self) -> None:
        # Called before initialize and again by send_error: every answer, errors included, carries the id.
        if not hasattr(self, "engine_id"):
            self.engine_id = new_request_id()  # unique: the engine's requests are named from it
            self.request_id = client_request_id(self.request.headers.get("X-Request-Id")) or self.engine_id
        self.set_header("Server", "mindie-service")
        self.set_header("X-Request-Id", self.request_id)

    def prepare(self) -> None:
        # Never raise here: an answer sent before the body is read breaks the connection (module doc).
        cl = self.request.headers.get("Content-Length")
        limit = self.body_limit()
        if cl is not None and cl.isdigit() and int(cl) > drain_limit(limit):
            self._answer_and_close(self._too_large_error(int(cl)))
            return
        if cl is not None and cl.isdigit() and int(cl) > limit:
            self._too_large = True  # keep reading (and dropping) so the client sees the 413
        if len(self.request.headers) > MAX_HEADERS:
            self.refuse(BadRequestError(f"too many HTTP headers: {len(self.request.headers)} (at most {MAX_HEADERS})"))
        key_error = request_error(self)  # API keys of this route's plane (server/auth.py)
        if key_error is not None:
            self.refuse(key_error)

    def refuse(self, err: MindieError) -> None:
        """Answer ``err`` instead of this request, once its body has been read and dropped (from ``prepare``)."""
        if self._refusal is None:
            self._refusal = err
            self._chunks.clear()
            # Tornado calls the method named by the request after the body: this one shadows it.
            setattr(self, self.request.method.lower(), self._raise_refusal)

    def _raise_refusal(self, *args: Any, **kwargs: Any) -> None:
        assert self._refusal is not None
        raise self._refusal

    def body_limit(self) -> int:
        """Most body bytes this route takes: ServerConfig.maxRequestLength (an upload route sets its own)."""
        return self.ctx.settings.max_request_bytes

    def _too_large_error(self, size: int) -> PayloadTooLargeError:
        return PayloadTooLargeError(f"request body must be at most {self.ctx.settings.max_request_length} MB "
                                    f"(ServerConfig.maxRequestLength), got {size} bytes")

    def _answer_and_close(self, err: MindieError, log: bool = True) -> None:
        """Answer ``err`` now, with ``Connection: close``, and take the connection from Tornado: it is drained
        for up to bodyTimeoutSeconds before the close, so the client reads the answer instead of a reset."""
        self.error_reason = error_reason(err)
        self.set_status(err.status)
        body = json.dumps(self.error_json(err), ensure_ascii=True).encode()
        status = self.get_status()  # an API family's error_json may map the status (OpenAI: 422 -> 400)
        head = (f"HTTP/1.1 {status} {responses.get(status, 'Error')}\r\nServer: mindie-service\r\n"
                f"X-Request-Id: {self.request_id}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n")
        stream = self.detach()  # Tornado stops reading this request and serves nothing more on it
        start_linger(stream, head.encode() + body, self.ctx.settings.body_timeout)
        if log:  # (write_error's caller logs its own exception)
            self.log_exception(type(err), err, None)
        self.application.log_request(self)

    def data_received(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._refusal is not None:
            return  # counted and dropped
        if self._too_large or self._size > self.body_limit():
            self._too_large = True
            self._chunks.clear()
        else:
            self._chunks.append(chunk)

    def body(self) -> bytes:
        if self._too_large:
            raise self._too_large_error(self._size)
        return b"".join(self._chunks)

    def json_body(self) -> dict[str, Any]:
        return parse_json_body(self.body(), self.request.headers.get("Content-Type"))

    def write_json(self, obj: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        # allow_nan=False: NaN/Infinity are not JSON; a value that slipped through is a bug, not a reply.
        self.finish(json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False))

    # -- errors: mapped here, once ---------------------------------------------------------------
    def _body_read(self) -> bool:
        """True once the request body has been read to its end (or the client left)."""
        fut = getattr(self.request, "_body_future", None)
        return fut is None or fut.done()

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, MindieError):
            err = exc
        elif isinstance(exc, tornado.web.HTTPError) and exc.status_code == 405:
            err = MethodNotAllowedError(f"method {self.request.method} is not allowed on {self.request.path}")
        elif isinstance(exc, tornado.web.HTTPError):
            err = http_error_for(exc.status_code, exc.log_message or self._reason)
        elif status_code >= 500:
            err = IncompleteGenerationError("internal server error")
        else:
            err = http_error_for(status_code, self._reason)
        self.error_reason = error_reason(err)
        if not self._body_read():  # refused before its body (Tornado's 405 for an unknown method)
            self._answer_and_close(err, log=False)
            return
        self.set_status(err.status)
        self.set_header("Content-Type", "application/json")
        if isinstance(err, UnauthorizedError):
            self.set_header("WWW-Authenticate", 'Bearer realm="mindie-service"')
        # ensure_ascii: a message may quote client text holding lone surrogates, which UTF-8 cannot encode.
        self.finish(json.dumps(self.error_json(err), ensure_ascii=True))

    def error_json(self, err: MindieError) -> Any:
        """The error body of this route's API family (the OpenAI routes override it with their encoder's)."""
        return err.to_json()

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if self.aborted and isinstance(value, StreamClosedError):
            logger.debug("%s %s: client closed the connection", self.request.method, self.request.path)
        elif isinstance(value, MindieError):
            logger.debug("%s %s -> %d %s: %s", self.request.method, self.request.path, value.status,
                        value.error_type, value.message)
        else:
            super().log_exception(typ, value, tb)


class NotFoundHandler(BaseHandler):
    """Default handler: every method on an unknown route is a 404 (once the body has been dropped); under
    ``/v1/`` in OpenAI's error shape (the OpenAI clients show its message; a MindIE body reads as "Error code: 404")."""

    def prepare(self) -> None:
        super().prepare()
        self.refuse(NotFoundError(f"unknown route: {self.request.method} {self.request.path}"))

    def error_json(self, err: MindieError) -> Any:
        if self.request.path.startswith("/v1/"):
            return openai_error(err)[1]
        return err.to_json()

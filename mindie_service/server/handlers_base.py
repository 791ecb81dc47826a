"""The base of every handler: body cap (413), JSON parsing (400), and the one place errors become
``{"error", "error_type"}`` responses."""
from __future__ import annotations

import json
import logging
from typing import Any

import tornado.web

from mindie_service.errors import (
    BadRequestError,
    IncompleteGenerationError,
    MethodNotAllowedError,
    MindieError,
    NotFoundError,
    PayloadTooLargeError,
)
from mindie_service.protocol.validation import parse_json_body
from mindie_service.server.context import ServerContext

logger = logging.getLogger(__name__)

MAX_HEADERS = 100


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


@tornado.web.stream_request_body
class BaseHandler(tornado.web.RequestHandler):
    """Streams the body in so that a body over ``maxRequestLength`` is counted and dropped, never kept."""

    ctx: ServerContext

    def initialize(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self._chunks: list[bytes] = []
        self._size = 0
        self._too_large = False

    def set_default_headers(self) -> None:
        self.set_header("Server", "mindie-service")

    def prepare(self) -> None:
        if len(self.request.headers) > MAX_HEADERS:
            raise BadRequestError(f"too many HTTP headers: {len(self.request.headers)} (at most {MAX_HEADERS})")
        cl = self.request.headers.get("Content-Length")
        if cl is not None and cl.isdigit() and int(cl) > self.ctx.settings.max_request_bytes:
            self._too_large = True  # keep reading (and dropping) so the client sees the 413

    def data_received(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._too_large or self._size > self.ctx.settings.max_request_bytes:
            self._too_large = True
            self._chunks.clear()
        else:
            self._chunks.append(chunk)

    def body(self) -> bytes:
        if self._too_large:
            raise PayloadTooLargeError(
                f"request body must be at most {self.ctx.settings.max_request_length} MB "
                f"(ServerConfig.maxRequestLength), got {self._size} bytes")
        return b"".join(self._chunks)

    def json_body(self) -> dict[str, Any]:
        return parse_json_body(self.body(), self.request.headers.get("Content-Type"))

    def write_json(self, obj: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))

    # -- errors: mapped here, once ---------------------------------------------------------------
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
        self.set_status(err.status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(err.to_json(), ensure_ascii=False))

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if isinstance(value, MindieError):
            logger.debug("%s %s -> %d %s: %s", self.request.method, self.request.path, value.status,
                        value.error_type, value.message)
        else:
            super().log_exception(typ, value, tb)


class NotFoundHandler(BaseHandler):
    """Default handler: every method on an unknown route is a 404."""

    def prepare(self) -> None:
        raise NotFoundError(f"unknown route: {self.request.method} {self.request.path}")

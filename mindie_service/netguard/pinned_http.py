"""A guarded GET of a ``CheckedURL``: the connection goes only to the checked addresses (the Host header and
TLS SNI stay the URL's host), no redirects, connect and read timeouts, at most ``max_response_headers``
headers, and the byte cap enforced on Content-Length and while the body streams into the caller's sink.

The sink is the caller's: media spools and sniffs, the catalog writes a file, batch jobs collect bytes. A
sink may refuse a chunk by raising ``MediaError``; the fetch is then aborted with that error."""
from __future__ import annotations

import logging
import socket
from typing import Any, Protocol

from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.httputil import HTTPInputError
from tornado.netutil import Resolver
from tornado.simple_httpclient import HTTPTimeoutError, SimpleAsyncHTTPClient

from mindie_service.errors import MediaError

from .addresses import Address
from .guard_limits import UrlLimits, mb
from .urls import CheckedURL

logger = logging.getLogger(__name__)


class Sink(Protocol):
    """Where a guarded GET puts the body."""

    def expect(self, length: int) -> None:
        """The response announced ``length`` bytes (already checked against the cap)."""

    def write(self, chunk: bytes) -> None:
        """The next piece of the body (the cap already checked); raise MediaError to refuse it."""


class BytesSink:
    """Collects the body in memory (its size is bounded by the limits' cap)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def expect(self, length: int) -> None:
        pass

    def write(self, chunk: bytes) -> None:
        self.data += chunk


class PinnedResolver(Resolver):
    """Answers only for the one host already resolved and checked, with its checked addresses."""

    def initialize(self, host: str, addresses: list[Address]) -> None:  # type: ignore[override]
        self._host = host.lower()
        self._addresses = list(addresses)

    async def resolve(  # type: ignore[override]
        self, host: str, port: int, family: socket.AddressFamily = socket.AF_UNSPEC
    ) -> list[tuple[int, Any]]:
        if host.lower() != self._host:
            raise OSError(f"refusing to resolve unexpected host {host!r}")
        found = [(fam, (ip, port)) for fam, ip in self._addresses if family == socket.AF_UNSPEC or fam == family]
        if not found:
            raise OSError("no checked address of the requested family")
        return found


class _Guard:
    """Header and body callbacks of one fetch: status, header count, Content-Length and byte cap. A refusal
    is recorded and the connection aborted by raising HTTPInputError (tornado closes it quietly)."""

    def __init__(self, limits: UrlLimits, label: str, sink: Sink) -> None:
        self.limits, self.label, self.sink = limits, label, sink
        self.code: int | None = None
        self.header_count = 0
        self.size = 0
        self.failure: MediaError | None = None

    def fail(self, error: MediaError) -> None:
        if self.failure is None:
            self.failure = error
        raise HTTPInputError(f"fetch aborted: {error.message}")

    def _cap(self) -> str:
        return f"the {self.limits.cap_name} cap of {mb(self.limits.max_bytes)}"

    def on_header(self, line: str) -> None:
        if self.failure is not None:
            raise HTTPInputError("fetch aborted")
        if self.code is None:
            self._status_line(line)
            return
        if line in ("\r\n", "\n"):
            if self.code is not None and self.code < 200:  # an interim 1xx: a real status follows
                self.code = None
                self.header_count = 0
            return
        self.header_count += 1
        if self.header_count > self.limits.max_response_headers:
            self.fail(MediaError(
                f"{self.label}: the response has more than {self.limits.max_response_headers} headers", 422))
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            try:
                length = int(value.strip().split(",")[0])
            except ValueError:
                self.fail(MediaError(f"{self.label}: malformed Content-Length", 422))
                return
            if length > self.limits.max_bytes:
                self.fail(MediaError(f"{self.label}: Content-Length {length} is over {self._cap()}", 413))
            self._to_sink(self.sink.expect, length)

    def _status_line(self, line: str) -> None:
        try:
            self.code = int(line.split()[1])
        except (IndexError, ValueError):
            self.fail(MediaError(f"{self.label}: malformed HTTP status line", 422))
            return
        if 300 <= self.code < 400:
            self.fail(MediaError(f"{self.label}: the URL answered with a redirect (HTTP {self.code}); "
                                 "redirects are not followed", 422))
        elif self.code >= 200 and self.code != 200:
            self.fail(MediaError(f"{self.label}: the URL answered HTTP {self.code}, not 200", 422))

    def on_chunk(self, chunk: bytes) -> None:
        if self.failure is not None:
            raise HTTPInputError("fetch aborted")
        if self.size + len(chunk) > self.limits.max_bytes:
            self.fail(MediaError(f"{self.label}: the response body is over {self._cap()}", 413))
        self.size += len(chunk)
        self._to_sink(self.sink.write, chunk)

    def _to_sink(self, call: Any, arg: Any) -> None:
        try:
            call(arg)
        except MediaError as e:
            self.fail(e)


async def pinned_get(target: CheckedURL, limits: UrlLimits, label: str, sink: Sink) -> int:
    """GET ``target.url`` connecting only to ``target.addresses``; the body goes to ``sink``. Returns the
    body's size. Every refusal or failure is a MediaError starting with ``label``."""
    guard = _Guard(limits, label, sink)
    client = SimpleAsyncHTTPClient(
        force_instance=True,
        resolver=PinnedResolver(host=target.host, addresses=list(target.addresses)),
        max_clients=1,
        max_header_size=limits.max_header_bytes,
        # The streaming callback enforces the real cap (so the reason is known); this only keeps tornado's
        # own limit out of the way.
        max_body_size=1 << 62,
    )
    request = HTTPRequest(
        target.url, method="GET", headers={"Accept": "*/*", "User-Agent": limits.user_agent},
        follow_redirects=False, connect_timeout=limits.connect_timeout,
        request_timeout=limits.connect_timeout + limits.read_timeout, decompress_response=False,
        header_callback=guard.on_header, streaming_callback=guard.on_chunk, validate_cert=True,
    )
    try:
        response = await client.fetch(request, raise_error=False)
    except HTTPTimeoutError:
        if guard.failure is not None:
            raise guard.failure from None
        logger.info("%s: URL fetch timed out", label)
        raise MediaError(f"{label}: fetching the URL timed out (connect {limits.connect_timeout:g} s, "
                         f"read {limits.read_timeout:g} s)", 408) from None
    except (HTTPClientError, OSError, HTTPInputError, ValueError) as e:
        if guard.failure is not None:
            raise guard.failure from None
        logger.info("%s: URL fetch failed: %s", label, type(e).__name__)
        raise MediaError(f"{label}: fetching the URL failed ({_describe(e)})", 422) from None
    finally:
        client.close()
    if guard.failure is not None:
        raise guard.failure
    if response.code != 200:
        raise MediaError(f"{label}: the URL answered HTTP {response.code}, not 200", 422)
    logger.debug("%s: fetched %d bytes over http", label, guard.size)
    return guard.size


def _describe(e: BaseException) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text else type(e).__name__

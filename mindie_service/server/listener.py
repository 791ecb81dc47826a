"""The HTTP listener: Tornado's HTTPServer with the connection-level bounds a handler cannot set.

- at most ``max_connections`` open connections; one more gets a short 503 and is closed at once
  (cheap: no parsing, no handler), with a rate-limited log line instead of one per refusal;
- headers over ``max_header_size`` get a 431 before the connection closes (Tornado drops it silently);
- a body must arrive within ``body_timeout`` seconds of its headers (Tornado's ``body_timeout``);
- a body over ``drain_limit`` is refused before it is read, and the connection is closed only after
  draining what the client still sends (``linger_close``), so the client reads the refusal, not a reset;
- on a TLS listener, a connection whose first byte is not a TLS handshake record (0x16) gets a 400 saying
  to use https (as nginx does) instead of a handshake failure and a reset;
- the soft open-files limit is raised at start-up to hold every listener's connections."""
from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Any

from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop
from tornado.iostream import IOStream, SSLIOStream, StreamClosedError, UnsatisfiableReadError

from mindie_service.errors import ConfigError

logger = logging.getLogger(__name__)

_REFUSED_BODY = b'{"error":"too many open connections (ServerConfig.maxConnections)","error_type":"overloaded"}'
REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
           b"Content-Length: " + str(len(_REFUSED_BODY)).encode() + b"\r\n\r\n" + _REFUSED_BODY)
_HEADERS_BODY = b'{"error":"request headers are too large (at most 64 KB)","error_type":"validation"}'
HEADERS_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: " + str(len(_HEADERS_BODY)).encode() + b"\r\n\r\n"
                     + _HEADERS_BODY)
_PLAIN_BODY = (b'{"error":"The plain HTTP request was sent to HTTPS port: use https://","error_type":"validation"}')
PLAIN_ON_TLS = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\n"
                b"Content-Length: " + str(len(_PLAIN_BODY)).encode() + b"\r\n\r\n" + _PLAIN_BODY)
TLS_HANDSHAKE = 0x16  # the content type of the record that carries a TLS ClientHello
SNIFF_TIMEOUT_S = 10.0  # how long a new TLS connection may stay silent before Tornado's handshake takes it
FD_MARGIN = 256  # files the process needs besides its connections (model files, logs, sockets out)
LINGER_MAX_S = 10.0  # the longest a refused connection is drained before its close


def drain_limit(max_request_bytes: int) -> int:
    """The largest body read (and dropped) to answer its 413 on a kept-alive connection (the listener's
    ``max_body_size``); a larger one is answered at once with ``Connection: close``."""
    return 2 * max_request_bytes + (1 << 20)


def start_linger(stream: IOStream, answer: bytes, timeout: float) -> None:
    """``linger_close`` as a task, held by the stream's listener until it ends (a task nothing holds may be
    collected mid-way)."""
    task = asyncio.ensure_future(linger_close(stream, answer, timeout))
    server = getattr(stream, "server", None)
    if server is not None:
        server.linger_tasks.add(task)
        task.add_done_callback(server.linger_tasks.discard)


async def linger_close(stream: IOStream, answer: bytes, timeout: float) -> None:
    """Send ``answer`` (which says ``Connection: close``), then read and drop what the client still sends
    until it closes, for at most ``timeout`` seconds (and ``LINGER_MAX_S``), then close. Closing a socket
    with unread input makes the kernel send a reset, which can destroy the answer before the client reads
    it. The connection still counts against the listener's maxConnections while it lingers."""
    server = getattr(stream, "server", None)
    if server is not None:
        server.lingering += 1
    try:
        await stream.write(answer)
        async with asyncio.timeout(min(timeout, LINGER_MAX_S)):
            while True:
                await stream.read_bytes(1 << 16, partial=True)
    except (StreamClosedError, TimeoutError, OSError):
        pass
    finally:
        stream.close()
        if server is not None:
            server.lingering -= 1


def _send_now(stream: IOStream, data: bytes) -> None:
    """Best effort, non-blocking: these replies are a courtesy to a client about to be dropped."""
    try:
        stream.socket.send(data)
    except Exception:  # noqa: BLE001 - the socket may be gone or not writable; the close still happens
        pass


class _HeaderCapMixin:
    """Answers 431 when the header read overflows, then lets Tornado close the connection."""

    _read_max_bytes: int | None

    def _check_max_bytes(self, delimiter: Any, size: int) -> None:
        if self._read_max_bytes is not None and size > self._read_max_bytes and not getattr(self, "_sent_431", False):
            self._sent_431 = True
            _send_now(self, HEADERS_TOO_LARGE)  # type: ignore[arg-type]
            raise UnsatisfiableReadError(f"delimiter {delimiter!r} not found within {self._read_max_bytes} bytes")
        super()._check_max_bytes(delimiter, size)  # type: ignore[misc]


class _CappedIOStream(_HeaderCapMixin, IOStream):
    pass


class _CappedSSLIOStream(_HeaderCapMixin, SSLIOStream):
    pass


class RefusalLog:
    """One log line per ``interval`` seconds however many connections are refused."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval, self.count, self._last = interval, 0, float("-inf")

    def refused(self, limit: int) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            logger.warning("refusing connections over ServerConfig.maxConnections = %d (%d refused so far)",
                           limit, self.count)


class BoundedHTTPServer(HTTPServer):
    """HTTPServer with a cap on open connections and a 431 for oversized headers."""

    def initialize(self, *args: Any, max_connections: int = 1024, **kwargs: Any) -> None:  # type: ignore[override]
        super().initialize(*args, **kwargs)
        self.max_connections = max_connections
        self.refusals = RefusalLog()
        self.lingering = 0  # connections refused and being drained before their close (linger_close)
        self.linger_tasks: set[asyncio.Future[None]] = set()
        self.sniffing = 0  # TLS connections waiting for their first byte (_handle_connection)

    @property
    def open_connections(self) -> int:
        return len(self._connections) + self.lingering + self.sniffing

    def _handle_connection(self, connection: socket.socket, address: Any) -> None:
        """On a TLS listener, wait for the first byte before the handshake: a plain-HTTP request gets
        ``PLAIN_ON_TLS`` (then the connection lingers and closes), anything else goes to Tornado's TLS."""
        if self.ssl_options is None:
            super()._handle_connection(connection, address)
            return
        if self.open_connections >= self.max_connections:  # refused at once, as handle_stream does
            self.refusals.refused(self.max_connections)
            connection.close()
            return
        connection.setblocking(False)
        loop, fd = IOLoop.current(), connection.fileno()
        self.sniffing += 1

        def decide(*_: Any) -> None:
            loop.remove_handler(fd)
            loop.remove_timeout(timer)
            self.sniffing -= 1
            try:
                first = connection.recv(1, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                first = bytes([TLS_HANDSHAKE])  # the timeout fired first: Tornado's handshake decides
            except OSError:
                connection.close()
                return
            if not first:
                connection.close()
            elif first[0] == TLS_HANDSHAKE:
                super(BoundedHTTPServer, self)._handle_connection(connection, address)
            else:
                self._refuse_plain(connection)

        timer = loop.call_later(SNIFF_TIMEOUT_S, decide)
        loop.add_handler(fd, decide, IOLoop.READ)

    def _refuse_plain(self, connection: socket.socket) -> None:
        logger.debug("a plain-HTTP request on a TLS listener: answered 400")
        stream = IOStream(connection)
        stream.server = self  # type: ignore[attr-defined]
        start_linger(stream, PLAIN_ON_TLS, 2.0)

    def handle_stream(self, stream: IOStream, address: tuple) -> None:
        if self.open_connections >= self.max_connections:
            self.refusals.refused(self.max_connections)
            _send_now(stream, REFUSED)
            stream.close()
            return
        stream.__class__ = _CappedSSLIOStream if isinstance(stream, SSLIOStream) else _CappedIOStream
        stream.server = self  # type: ignore[attr-defined]  # linger_close counts the connection here
        super().handle_stream(stream, address)


def raise_open_files_limit(needed: int) -> int:
    """Raise the soft RLIMIT_NOFILE to ``needed`` (+ a margin) when it is lower; ConfigError when the
    hard limit is too low. Returns the soft limit in force."""
    try:
        import resource
    except ImportError:  # not on POSIX: nothing to raise
        return needed
    want = needed + FD_MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return soft if soft != resource.RLIM_INFINITY else want
    if hard != resource.RLIM_INFINITY and hard < want:
        raise ConfigError(f"ServerConfig.maxConnections needs {want} open files (connections of every listener + "
                          f"{FD_MARGIN}), but the hard open-files limit is {hard}: lower maxConnections or raise "
                          f"the limit (ulimit -Hn)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    logger.info("raised the soft open-files limit from %d to %d", soft, want)
    return want

"""A plain-HTTP request on a TLS listener gets a 400 saying to use https (as nginx does), not a reset;
a TLS client on the same listener is still served."""
from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from tornado.web import Application, RequestHandler

from mindie_service.devkit import certs
from mindie_service.server.listener import BoundedHTTPServer


class _Hello(RequestHandler):
    def get(self) -> None:
        self.write("hello")


def _serve(sec: Path, **kw: int) -> Iterator[int]:
    """A TLS listener on a free port in a thread of its own, serving ``_Hello``; its port."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(sec / "certs/server.pem"), str(sec / "keys/server.key.pem"))
    loop = asyncio.new_event_loop()
    started, box = threading.Event(), {}

    def run() -> None:
        asyncio.set_event_loop(loop)
        srv = BoundedHTTPServer(Application([(r"/", _Hello)]), ssl_options=ctx, **kw)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        sock.setblocking(False)
        srv.add_sockets([sock])
        box["port"] = sock.getsockname()[1]
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(10)
    yield box["port"]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sec = tmp_path_factory.mktemp("pki") / "security"
    certs.generate_dev_certs(str(sec))
    return sec


@pytest.fixture(scope="module")
def tls_port(pki: Path) -> Iterator[tuple[int, Path]]:
    for port in _serve(pki):
        yield port, pki


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def test_plain_http_on_the_tls_port_gets_a_400_naming_https(tls_port: tuple[int, Path]) -> None:
    with socket.create_connection(("127.0.0.1", tls_port[0]), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        sock.shutdown(socket.SHUT_WR)
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"The plain HTTP request was sent to HTTPS port" in answer and b"https://" in answer


def test_a_tls_client_is_still_served(tls_port: tuple[int, Path]) -> None:
    port, sec = tls_port
    ctx = ssl.create_default_context(cafile=str(sec / "ca/ca.pem"))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"hello")


def test_silent_connections_over_max_connections_are_refused_at_once(pki: Path) -> None:
    for port in _serve(pki, max_connections=2):
        held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]  # waiting to speak
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as third:
                assert third.recv(1) == b""  # closed at once, not held until it speaks
        finally:
            for sock in held:
                sock.close()

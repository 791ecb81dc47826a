"""Issue 15, connections: every early error leaves a kept-alive connection usable, or says
``Connection: close`` and closes cleanly.

A handler that answered before reading the body (an unknown route's 404) made Tornado close the connection
without ``Connection: close`` and with unread input: the client's next request on its pooled connection
was reset (about 60 of 300 such pairs). Here one kept-alive client (httpx, as every SDK) goes through each
error kind followed by a real request, hundreds of times, and the server must keep the connection (the
local port of the error and of the next request is the same) unless it said ``Connection: close``."""
from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from typing import Any

import httpx2 as httpx
import pytest

from tests.server_utils import plain_server

ROUNDS = 28  # x 11 error kinds: 308 error + request pairs
MB = 1 << 20


@pytest.fixture(scope="module")
def srv(request, tiny_model):
    return plain_server(request, tiny_model)  # maxRequestLength 1 MB: bodies over 3 MB are not drained


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: str
    status: int
    kw: dict[str, Any] = field(default_factory=dict)
    closes: bool = False  # the server answers before the body and says Connection: close


CASES = [
    Case("404 with a body", "POST", "/no/such/route", 404, {"json": {"inputs": "x" * 4000}}),
    Case("404 without a body", "GET", "/no/such/route", 404),
    Case("405 known method", "GET", "/", 405),
    Case("405 with a body", "PUT", "/generate", 405, {"json": {"inputs": "hi"}}),
    Case("400 bad JSON", "POST", "/", 400, {"content": b"{not json", "headers": {"Content-Type": "application/json"}}),
    Case("400 content type", "POST", "/", 400, {"content": b"inputs=hi", "headers": {"Content-Type": "text/plain"}}),
    Case("422 validation", "POST", "/", 422, {"json": {"inputs": "hi", "parameters": {"max_new_tokens": -1}}}),
    Case("413 drained", "POST", "/", 413, {"content": b"x" * (MB + MB // 2),
                                           "headers": {"Content-Type": "application/json"}}),
    Case("400 too many headers", "POST", "/", 400, {"json": {"inputs": "hi"},
                                                    "headers": {f"X-H{i}": "v" for i in range(120)}}),
    Case("413 too large to drain", "POST", "/", 413, {"content": b"x" * (4 * MB),
                                                      "headers": {"Content-Type": "application/json"}}, closes=True),
    Case("405 unknown method", "FROB", "/", 405, {"content": b"x" * 3000}, closes=True),
]

GENERATE = {"inputs": "The lantern by the harbor", "parameters": {"max_new_tokens": 2}}


def local_port(r: httpx.Response) -> int:
    """The client's port of the connection ``r`` came on; -1 when that connection is closed already."""
    try:
        return r.extensions["network_stream"].get_extra_info("client_addr")[1]
    except OSError:
        return -1


def test_every_early_error_leaves_the_kept_alive_connection_usable(srv):
    reused = closed = generated = 0
    with httpx.Client(base_url=srv.url(), timeout=60) as c:
        for i in range(ROUNDS):
            for k, case in enumerate(CASES):
                r = c.request(case.method, case.path, **case.kw)
                assert r.status_code == case.status, (case.name, r.text)
                assert set(r.json()) == {"error", "error_type"}, case.name
                port = local_port(r) if not case.closes else None
                says_close = r.headers.get("Connection", "").lower() == "close"
                assert says_close == case.closes, (case.name, dict(r.headers))
                # the real request after it: a short generation now and then, /health otherwise
                if (i + k) % 4 == 0:
                    nxt = c.post("/", json=GENERATE)
                    assert nxt.status_code == 200 and nxt.json()[0]["generated_text"], nxt.text
                    generated += 1
                else:
                    nxt = c.get("/health")
                    assert nxt.status_code == 200
                if says_close:
                    closed += 1
                else:
                    assert local_port(nxt) == port, f"{case.name}: the server dropped the kept-alive connection"
                    reused += 1
    assert (reused, closed) == (ROUNDS * 9, ROUNDS * 2) and generated >= 70


def _read_response(f: Any) -> tuple[int, dict[str, str], bytes]:
    status = int(f.readline().split()[1])
    headers: dict[str, str] = {}
    while (line := f.readline().strip()):
        k, v = line.decode().split(":", 1)
        headers[k.strip().lower()] = v.strip()
    return status, headers, f.read(int(headers.get("content-length", 0)))


def test_pipelined_requests_after_a_refused_body_are_all_answered(srv):
    host, port = srv.url().rsplit("//", 1)[1].split(":")
    body = json.dumps({"inputs": "y" * 5000}).encode()
    refused = (b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    too_many = (b"POST / HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(120))
                + b"Content-Type: application/json\r\n" + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall((refused + health + too_many + health) * 5)  # all at once: the server must not skip any
        f = sock.makefile("rb")
        got = [_read_response(f)[0] for _ in range(20)]
        assert got == [404, 200, 400, 200] * 5
        sock.sendall(health)  # and the connection is still open
        assert _read_response(f)[0] == 200


def test_a_body_too_large_to_drain_is_refused_and_the_client_can_still_send_it_and_read_the_413(srv):
    """A client that sends its whole body before reading (sendall, then recv) reads the 413: the server
    answers at once but drains what comes until the client closes, rather than closing on unread input (a
    reset that fails the client's send and destroys the answer)."""
    host, port = srv.url().rsplit("//", 1)[1].split(":")
    body = b"x" * (8 * MB)  # over 2 x maxRequestLength + 1 MB: not drained on a kept-alive connection
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode())
        for i in range(0, len(body), 256 * 1024):
            sock.sendall(body[i:i + 256 * 1024])  # the server must not reset the connection meanwhile
        f = sock.makefile("rb")
        status, headers, payload = _read_response(f)
        assert status == 413 and headers["connection"] == "close"
        assert json.loads(payload)["error_type"] == "validation" and "maxRequestLength" in json.loads(payload)["error"]
        sock.shutdown(socket.SHUT_WR)
        assert f.read() == b""  # then the server closes, cleanly

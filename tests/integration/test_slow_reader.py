"""Issue 15, slow clients: a client that does not read its stream never holds the engine back. Its output
is buffered up to ServerConfig.maxStreamBufferBytes (4096 here), then the request is aborted (the engine
frees its KV blocks), the reason is logged with the request id (never the prompt), and its connection is
closed; a concurrent request is served meanwhile.

Before, the response task awaited every flush: a client that stopped reading kept its request generating
into an unbounded queue, and no abort ever came (the warning and the counter below never appear)."""
from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.server_utils import ServerProcess, free_port, shared_server, wait_until, write_config

PROMPT = "The lantern by the harbor window"
# Big frames (20 alternatives per token) fill the socket buffers in seconds; 3000 tokens would take far longer.
STUCK = {"inputs": PROMPT, "parameters": {"max_new_tokens": 3000, "details": True, "top_n_tokens": 20}}


@pytest.fixture(scope="module")
def srv(request, tiny_model):
    def make(tmp: Path) -> ServerProcess:
        port = free_port()
        cfg = write_config(tmp / "config.json", tiny_model,
                           server={"port": port, "managementPort": port, "metricsPort": port,
                                   "maxStreamBufferBytes": 4096},
                           deploy={"maxSeqLen": 4096, "maxInputTokenLen": 256},
                           schedule={"maxIterTimes": 4000, "numKvBlocks": 600, "maxPrefillTokens": 4096})
        return ServerProcess(cfg, tmp / "server.log")
    return shared_server("slow-reader", request, make)


def counter(srv, name: str) -> float:
    prefix = f'{name}{{model_name="tiny"}} '
    return float(next(line for line in srv.get("/metrics").text.splitlines() if line.startswith(prefix))[len(prefix):])


def idle(srv) -> bool:
    st = srv.status()
    return st["requests"]["running"] == 0 and st["requests"]["in_flight"] == 0 and st["blocks"]["free"] == st[
        "blocks"]["total"]


def test_a_client_that_never_reads_its_stream_is_aborted_and_others_are_served(srv):
    assert wait_until(lambda: idle(srv))
    before = counter(srv, "stream_aborted_slow_client_total")
    offset = len(srv.log_path.read_text(errors="replace"))
    host, port = srv.url().rsplit("//", 1)[1].split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # a small window: the server's buffer fills
    sock.connect((host, int(port)))
    body = json.dumps(STUCK).encode()
    sock.sendall(b"POST /generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    try:
        assert wait_until(lambda: srv.status()["requests"]["running"] == 1, timeout=30)
        # the engine goes on for everyone else while this client reads nothing
        other = srv.post("/", {"inputs": "hi", "parameters": {"max_new_tokens": 4}})
        assert other.status_code == 200 and other.json()[0]["generated_text"]
        assert wait_until(lambda: counter(srv, "stream_aborted_slow_client_total") == before + 1, timeout=120), \
            srv.status()
        log = srv.log_path.read_text(errors="replace")[offset:]
        warning = next(line for line in log.splitlines() if "maxStreamBufferBytes" in line)
        assert " WARNING " in warning and re.search(r"[0-9a-f]+-\d+: the client is not reading", warning)
        assert PROMPT not in log
        assert wait_until(lambda: idle(srv), timeout=30), srv.status()  # aborted: its KV blocks are free
        # and its connection was closed, without the stream's end
        sock.settimeout(30)
        data = b""
        while chunk := sock.recv(1 << 16):
            data += chunk
        assert data.startswith(b"HTTP/1.1 200") and not data.endswith(b"0\r\n\r\n")
    finally:
        sock.close()


def test_the_buffer_bound_ends_with_the_stream(srv):
    """A kept-alive connection that streamed still takes a response larger than maxStreamBufferBytes."""
    with httpx.Client(base_url=srv.url(), timeout=60) as c:
        with c.stream("POST", "/generate_stream", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 8}}) as r:
            assert r.status_code == 200 and len(list(r.iter_lines())) > 8
        big = c.get("/openapi.json")
        assert big.status_code == 200 and len(big.content) > 3 * 4096 and big.json()["paths"]

"""Issue 15, MindIE's admission rule over HTTP: maxLinkNum requests run, 2 x maxLinkNum more wait (first come
first served) and are served as slots free, the next gets 429 ``overloaded`` at once; /v2/health/ready is 503
while the queue is full; a queued request whose e2eTimeout passes gets the timeout error and leaves the
queue, and so does one whose client leaves.

In process (a mock engine, the slot held by the test itself) for the timing-sensitive cases; on the real
server with the tiny model for the whole rule."""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import json
import socket
from pathlib import Path

import httpx2 as httpx
import pytest
import requests
from tornado.iostream import IOStream
from tornado.testing import gen_test

from tests.inprocess import InProcessServer
from tests.server_utils import ServerProcess, free_port, shared_server, wait_until, write_config

BODY = {"inputs": "hello", "parameters": {"max_new_tokens": 3}}


class Queue(InProcessServer):
    """maxLinkNum 1; the test takes the one slot itself to make requests queue. The timeouts are far from what
    a request that must pass needs, on any machine (a queued request's e2eTimeout counts its time in the queue).
    Helpers only: the tests are in the classes below."""

    server = {"tokenTimeout": 30, "e2eTimeout": 60, "maxLinkNum": 1}

    def post(self, body=BODY, timeout=20):
        return self.http_client.fetch(self.get_url("/"), method="POST", body=json.dumps(body),
                                      headers={"Content-Type": "application/json"}, raise_error=False,
                                      request_timeout=timeout)

    async def until(self, cond, timeout=30.0):  # a hang guard: true at once on any machine that works
        for _ in range(int(timeout / 0.01)):
            if cond():
                return True
            await asyncio.sleep(0.01)
        return cond()


class QueueInProcess(Queue):
    @gen_test(timeout=20)
    async def test_a_client_that_leaves_while_queued_leaves_the_queue(self):
        await self.ctx.admit()
        body = json.dumps(BODY).encode()
        stream = IOStream(socket.socket())
        await stream.connect(("127.0.0.1", self.get_http_port()))
        await stream.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert await self.until(lambda: self.ctx.queued == 1)
        stream.close()
        assert await self.until(lambda: self.ctx.queued == 0)
        assert self.ctx.in_flight == 1  # it never took the slot
        self.ctx.release()
        assert self.ctx.admission.idle.is_set()
        resp = await self.post()
        assert resp.code == 200, resp.body

    @gen_test(timeout=20)
    async def test_queue_full_means_not_ready_and_429_at_once(self):
        await self.ctx.admit()
        ready = await self.http_client.fetch(self.get_url("/v2/health/ready"), raise_error=False)
        assert ready.code == 200  # running at maxLinkNum, but the queue has room
        queued = [asyncio.ensure_future(self.post(timeout=20)) for _ in range(2)]
        assert await self.until(lambda: self.ctx.queued == 2)
        ready = await self.http_client.fetch(self.get_url("/v2/health/ready"), raise_error=False)
        assert ready.code == 503 and "overloaded" in json.loads(ready.body)["error"]
        status = json.loads((await self.http_client.fetch(self.get_url("/v1/status"))).body)
        assert (status["requests"]["in_flight"], status["requests"]["queued"]) == (1, 2)
        refused = await self.post()
        assert refused.code == 429 and json.loads(refused.body)["error_type"] == "overloaded"
        assert "maxLinkNum" in json.loads(refused.body)["error"]
        metrics = (await self.http_client.fetch(self.get_url("/metrics"))).body.decode()
        assert 'num_requests_queued{model_name="mock"} 2.0' in metrics
        self.ctx.release()  # the slot frees: both queued requests are served in turn
        assert [r.code for r in await asyncio.gather(*queued)] == [200, 200]
        assert (self.ctx.in_flight, self.ctx.queued) == (0, 0)


class QueueTimeout(Queue):
    """e2eTimeout 0.6 s: a request queued behind the slot the test holds can only time out."""

    server = {"tokenTimeout": 30, "e2eTimeout": 0.6, "maxLinkNum": 1}

    @gen_test(timeout=20)
    async def test_a_queued_request_whose_e2e_timeout_passes_gets_504_and_leaves_the_queue(self):
        await self.ctx.admit()  # the one slot is busy
        resp = await self.post()
        assert resp.code == 504, resp.body
        err = json.loads(resp.body)
        assert err["error_type"] == "timeout" and "admission queue" in err["error"] and "e2eTimeout" in err["error"]
        assert (self.ctx.in_flight, self.ctx.queued) == (1, 0)
        self.ctx.release()
        assert (self.ctx.in_flight, self.ctx.queued) == (0, 0) and self.ctx.admission.idle.is_set()


# -- the real server ------------------------------------------------------------------------------
LONG = {"inputs": "The lantern by the harbor window", "parameters": {"max_new_tokens": 3000}}
SHORT = {"inputs": "The lantern by the harbor window", "parameters": {"max_new_tokens": 4}}


@pytest.fixture(scope="module")
def srv(request, tiny_model):
    def make(tmp: Path) -> ServerProcess:
        port = free_port()
        cfg = write_config(tmp / "config.json", tiny_model,
                           server={"port": port, "managementPort": port, "metricsPort": port, "maxLinkNum": 1},
                           deploy={"maxSeqLen": 4096, "maxInputTokenLen": 256},
                           schedule={"maxIterTimes": 4000, "numKvBlocks": 600, "maxPrefillTokens": 4096})
        return ServerProcess(cfg, tmp / "server.log")
    return shared_server("admission1", request, make)


def test_one_runs_two_wait_and_are_served_the_fourth_is_refused_at_once(srv):
    running = requests.post(srv.url() + "/generate_stream", json=LONG, stream=True, timeout=60)
    assert running.status_code == 200
    lines = running.iter_lines()
    assert next(line for line in lines if line.startswith(b"data:"))  # admitted and generating
    with cf.ThreadPoolExecutor(2) as ex:
        waiting = [ex.submit(srv.post, "/", SHORT, timeout=60) for _ in range(2)]
        assert wait_until(lambda: srv.status()["requests"]["queued"] == 2, timeout=30), srv.status()
        assert srv.get("/v2/health/ready").status_code == 503  # the queue is full
        with httpx.Client(base_url=srv.url(), timeout=30) as c:  # kept alive across the 429
            refused = c.post("/", json=SHORT)
            assert refused.status_code == 429 and refused.json()["error_type"] == "overloaded"
            port = refused.extensions["network_stream"].get_extra_info("client_addr")[1]
            assert c.get("/health").extensions["network_stream"].get_extra_info("client_addr")[1] == port
        assert not any(w.done() for w in waiting)  # still queued behind the running one
        running.close()  # the running client leaves: its slot goes to the first in line
        answers = [w.result(timeout=60) for w in waiting]
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    assert all(a.json()[0]["generated_text"] for a in answers)
    assert wait_until(lambda: srv.status()["requests"]["in_flight"] == 0 and srv.status()["requests"]["queued"] == 0)
    assert srv.get("/v2/health/ready").status_code == 200

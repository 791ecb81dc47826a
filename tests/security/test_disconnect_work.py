"""Issue #16, item 2's last clause: no work for a request whose client is gone. With one tokenizer worker
busy on a slow request, a second client sends its request and disconnects while that request waits in the
tokenizer pool: neither its parsing nor its tokenization (or media) may run once the pool frees up.
Asserted on counters of the pool's jobs and of the input processor's calls, never on time."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

from tornado.iostream import IOStream
from tornado.testing import gen_test

from mindie_service.devkit.mock_engine import MockEngine
from mindie_service.server.handlers_base import BaseHandler
from tests.inprocess import InProcessServer


class CountingPool(ThreadPoolExecutor):
    """The tokenizer pool, counting the jobs that actually ran (a cancelled queued job never does)."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="tokenize")
        self.ran = 0

    def submit(self, fn, /, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        def counted():
            self.ran += 1
            return fn(*args, **kwargs)
        return super().submit(counted)


ROUTES = {
    "/": {"inputs": "PROMPT", "parameters": {"max_new_tokens": 2}},
    "/generate": {"inputs": "PROMPT", "parameters": {"max_new_tokens": 2}},
    "/api/generate-one": {"request_id": "KEY", "prompt": "PROMPT", "stream_response": False,
                          "generation_config": {"max_new_tokens": 2}},
}


class GoneWhileQueuedInThePool(InProcessServer):
    def make_engine(self, ctx):
        ctx.executor.shutdown(wait=False)
        self.pool = ctx.executor = CountingPool()
        engine = MockEngine(ctx.engine_config)
        self.gate = threading.Event()
        self.processed: list[str] = []
        real = ctx.frontend.processor(engine).process

        def process(prompt, params, **kw):  # noqa: ANN001, ANN003
            text = getattr(prompt, "text", "")
            self.processed.append(text)
            if text.startswith("slow"):  # the slow request holds the only tokenizer worker
                self.gate.wait(20)
            return real(prompt, params, **kw)

        ctx.frontend.processor(engine).process = process
        return engine

    def tearDown(self):
        self.gate.set()
        super().tearDown()  # shuts the counting pool down: it is ctx.executor

    def body(self, path: str, prompt: str) -> bytes:
        return json.dumps(ROUTES[path]).replace("PROMPT", prompt).replace("KEY", prompt).encode()

    async def until(self, cond, timeout=10.0):
        for _ in range(int(timeout / 0.01)):
            if cond():
                return True
            await asyncio.sleep(0.01)
        return cond()

    async def _case(self, path: str, slow_path: str = "/") -> None:
        closed = asyncio.Event()
        original = BaseHandler.on_connection_close

        def on_close(handler):  # noqa: ANN001
            original(handler)
            closed.set()

        BaseHandler.on_connection_close = on_close
        try:
            slow = asyncio.ensure_future(self.http_client.fetch(
                self.get_url(slow_path), method="POST", body=self.body(slow_path, "slow one"),
                headers={"Content-Type": "application/json"}, raise_error=False, request_timeout=30))
            assert await self.until(lambda: self.processed == ["slow one"])  # the pool's one worker is busy
            ran = self.pool.ran
            stream = IOStream(socket.socket())
            await stream.connect(("127.0.0.1", self.get_http_port()))
            data = self.body(path, "gone")
            await stream.write(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               b"Content-Length: %d\r\n\r\n" % (path.encode(), len(data)) + data)
            assert await self.until(lambda: self.ctx.open_handlers == 2)  # its handler waits for the pool
            stream.close()  # the client leaves while its request waits in the tokenizer pool
            await asyncio.wait_for(closed.wait(), 10)
            self.gate.set()
            resp = await slow
            assert resp.code == 200, resp.body
            assert await self.until(lambda: self.ctx.open_handlers == 0)
        finally:
            BaseHandler.on_connection_close = original
        assert self.processed == ["slow one"]  # no tokenizing or media work for the client that left
        assert self.pool.ran == ran  # not even its JSON was parsed in the pool
        assert self.ctx.in_flight == 0 and self.engine.stats().running == 0

    @gen_test(timeout=30)
    async def test_mindie_route(self):
        await self._case("/")

    @gen_test(timeout=30)
    async def test_tgi_route(self):
        await self._case("/generate")

    @gen_test(timeout=30)
    async def test_rest_route(self):
        await self._case("/api/generate-one", slow_path="/api/generate-one")

"""Request priority through HTTP to the engine: each route's priority field, through its parser, handler and
the serving core, reaches the admission queue and the engine request as one rank (params.priority's table),
in-process on the StandardMock engine."""
from __future__ import annotations

import asyncio
import json

from mindie_service.devkit.mock_engine import MockEngine
from mindie_service.engine.contract import EngineRequest
from tests.inprocess import InProcessServer


class _Recording(MockEngine):
    ranks: list[int]

    def generate(self, request: EngineRequest):
        self.ranks.append(request.rank)
        return super().generate(request)


class PriorityRoutesTest(InProcessServer):
    server = {"openAiSupport": "openai"}  # vLLM's priority field is taken whatever the setting

    def make_engine(self, ctx):
        eng = _Recording(ctx.engine_config)
        eng.ranks = []
        return eng

    def _post(self, path: str, body: dict) -> None:
        r = self.fetch(path, method="POST", body=json.dumps(body), headers={"Content-Type": "application/json"})
        assert r.code == 200, r.body

    def _spy_admission(self) -> list[int]:
        """The ranks the admission queue is asked for, in order."""
        admitted: list[int] = []
        queue = self.ctx.frontend.admission
        acquire = queue.acquire

        async def spy(n=1, timeout=None, rank=0):
            admitted.append(rank)
            return await acquire(n, timeout, rank)

        queue.acquire = spy
        return admitted

    def test_every_route_hands_its_priority_to_admission_and_the_engine(self):
        admitted = self._spy_admission()
        few = {"max_new_tokens": 2}
        self._post("/v1/completions", {"model": "mock", "prompt": "hi", "max_tokens": 2, "priority": -7})
        self._post("/v1/chat/completions", {"model": "mock", "messages": [{"role": "user", "content": "hi"}],
                                            "max_tokens": 2, "priority": 2})
        self._post("/", {"inputs": "hi", "parameters": {**few, "priority": 1}})
        self._post("/infer", {"inputs": "hi", "parameters": {**few, "priority": 3}})
        self._post("/v2/models/mock/generate", {"text_input": "hi", "parameters": {**few, "priority": 2}})
        self._post("/v2/models/mock/infer", {"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES",
                                                          "data": ["hi"]}], "parameters": {**few, "priority": 4}})
        self._post("/v1/responses", {"model": "mock", "input": "hi", "max_output_tokens": 2, "priority": -5})
        self._post("/generate", {"inputs": "hi", "parameters": few})  # TGI: no priority, the default rank
        expected = [-7, 2, -4, -2, -3, -1, -5, 0]
        assert admitted == expected and self.engine.ranks == expected

    def test_a_background_response_runs_at_its_priority(self):
        admitted = self._spy_admission()
        r = self.fetch("/v1/responses", method="POST", headers={"Content-Type": "application/json"},
                       body=json.dumps({"model": "mock", "input": "hi", "max_output_tokens": 2, "priority": 3,
                                        "background": True}))
        assert r.code == 200, r.body
        for _ in range(200):  # the background task runs on the server's loop
            if self.engine.ranks:
                break
            self.io_loop.run_sync(lambda: asyncio.sleep(0.01))
        assert admitted == [3] and self.engine.ranks == [3]

    def test_responses_refuses_a_bad_priority_in_its_error_shape(self):
        r = self.fetch("/v1/responses", method="POST", headers={"Content-Type": "application/json"},
                       body=json.dumps({"model": "mock", "input": "hi", "priority": "high"}))
        err = json.loads(r.body)["error"]
        assert r.code == 400 and err["param"] == "priority" and "priority" in err["message"], r.body

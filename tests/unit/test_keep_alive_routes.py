"""Ollama's keep_alive beyond the generation routes (issue 46), in process on StandardMock engines as
test_residency.py: the tokenizer routes (vLLM's /tokenize and /detokenize, MindIE's /v1/tokenizer) hold the model
they load with the body's keep_alive; a batch job's keep_alive applies to each line's hold of its model (one load
for the whole job, unloaded once after its last line); OpenAI's batch create refuses one, saying it belongs in each
line's body."""
from __future__ import annotations

import asyncio
import base64
import json

from tornado.testing import gen_test

from tests.unit.test_residency import ResidencyServer


class KeepAliveRoutesTest(ResidencyServer):
    server = {"idleUnloadSeconds": 0.5}

    def setUp(self) -> None:
        super().setUp()
        self.ctx.start_jobs()
        self.io_loop.add_callback(self.ctx.residency.start)

    def tearDown(self) -> None:
        self.io_loop.run_sync(self.ctx.stop_jobs)
        super().tearDown()

    def evictions(self, model: str) -> dict[str, int]:
        return self.ctx.catalog.entries[model].counters.evictions

    async def submit(self, model: str, lines: int, **extra: object) -> tuple[int, dict]:
        data = (json.dumps([{"role": "user", "text": "hi"}]) + "\n") * lines
        r = await self.post("/batch_inference/submit_job", {
            "model": model, "options": {"max_tokens": 2}, **extra,
            "prompt_file_path": {"type": "raw_bytes", "value": base64.b64encode(data.encode()).decode()}})
        return r.code, json.loads(r.body)

    async def finished(self, job_id: str) -> str:
        for _ in range(400):
            status = self.ctx.jobs.store.get(job_id).status
            if status not in ("validating", "running"):
                return status
            await asyncio.sleep(0.05)
        return "still running"

    @gen_test(timeout=60)
    async def test_the_tokenizer_routes_take_keep_alive(self) -> None:
        r = await self.post("/tokenize", {"model": "m1", "prompt": "hi", "keep_alive": 0})
        assert r.code == 200 and json.loads(r.body)["count"] > 0, r.body
        assert await self.settle("m1", "stopped", within=2.0)
        assert self.evictions("m1")["keep_alive"] == 1 and self.evictions("m1")["idle"] == 0
        r = await self.post("/detokenize", {"model": "m2", "tokens": [104, 105], "keep_alive": -1})
        assert r.code == 200, r.body
        r = await self.post("/v1/tokenizer", {"inputs": "hi", "keep_alive": "0s"})  # the default model
        assert r.code == 200 and json.loads(r.body)["token_number"] > 0, r.body
        assert await self.settle("mock", "stopped", within=2.0)
        assert self.evictions("mock")["keep_alive"] == 1
        await asyncio.sleep(0.7)
        assert self.state("m2") == "running"  # -1: kept past idleUnloadSeconds

    @gen_test(timeout=60)
    async def test_a_malformed_keep_alive_is_refused_in_each_routes_shape(self) -> None:
        r = await self.post("/tokenize", {"model": "m1", "prompt": "hi", "keep_alive": "soon"})
        assert r.code == 400 and "keep_alive" in json.loads(r.body)["error"]["message"], r.body
        r = await self.post("/v1/tokenizer", {"inputs": "hi", "keep_alive": [1]})
        assert r.code == 422 and "keep_alive" in json.loads(r.body)["error"], r.body
        code, body = await self.submit("m1", 1, keep_alive="later")
        assert code == 422 and "keep_alive" in json.dumps(body), body
        assert "m1" not in self.builds

    @gen_test(timeout=60)
    async def test_a_jobs_keep_alive_holds_its_model_line_by_line(self) -> None:
        code, body = await self.submit("m1", 6, keep_alive=0)
        assert code == 200 and body["metadata"]["options"]["keep_alive"] == 0, body
        assert await self.finished(body["job_id"]) == "completed"
        assert await self.settle("m1", "stopped", within=2.0)
        assert self.builds == {"m1": 1}  # the lines' holds overlap: one load, one unload after the last line
        assert self.evictions("m1")["keep_alive"] == 1 and self.evictions("m1")["idle"] == 0
        code, body = await self.submit("m2", 2, keep_alive="1h")
        assert code == 200 and body["metadata"]["options"]["keep_alive"] == 3600, body
        assert await self.finished(body["job_id"]) == "completed"
        await asyncio.sleep(0.7)
        assert self.state("m2") == "running"  # past idleUnloadSeconds: the job's keep_alive rules

    @gen_test(timeout=60)
    async def test_an_openai_batch_refuses_keep_alive_and_says_where_it_goes(self) -> None:
        r = await self.post("/v1/batches", {"input_file_id": "file-x", "endpoint": "/v1/chat/completions",
                                            "completion_window": "24h", "keep_alive": 0})
        msg = json.loads(r.body)["error"]["message"]
        assert r.code == 400 and "keep_alive" in msg and "each line" in msg, r.body

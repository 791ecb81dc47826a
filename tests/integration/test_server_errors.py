"""Failure paths of the generation handler, in process with an engine that misbehaves on demand:
424 when the engine fails a request (others go on), an error after the stream started as a final
SSE frame, 504 on tokenTimeout / e2eTimeout, 503 while loading or when the engine thread died."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from mindie_service.devkit.mock_engine import MockEngine
from mindie_service.engine.client import EngineClient
from mindie_service.errors import GenerationError
from tests.inprocess import InProcessServer


class MisbehavingEngine(MockEngine):
    """The prompt picks the fault: "fail@K" raises GenerationError before token K, "crash@K" raises a
    plain exception, "stall" never sends a token (only tokenTimeout ends it), "steady" sends its first token at
    once and then one every 0.15 s (only e2eTimeout ends it). Each timeout is far from what the requests that must
    pass need, so no outcome depends on the machine's speed."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.alive = True

    def healthy(self) -> bool:
        return self.alive and super().healthy()

    async def generate(self, request):
        text = bytes(t - 3 for t in request.prompt_token_ids[1:]).decode()
        self.token_delay_s = {"stall": 3600.0, "steady": 0.15}.get(text, 0.001)
        k = 0
        if text == "steady":
            self.token_delay_s = 0.0
        async for ev in super().generate(request):
            if text == "steady":
                self.token_delay_s = 0.15
            for kind, exc in (("fail@", GenerationError("the device fell over")), ("crash@", RuntimeError("bug"))):
                if text.startswith(kind) and k == int(text[len(kind):]):
                    raise exc
            k += 1
            yield ev


class Misbehaving(InProcessServer):
    """The in-process server on the MisbehavingEngine, and the helpers its tests share (no tests of its own)."""

    server = {"tokenTimeout": 30, "e2eTimeout": 60, "maxLinkNum": 8}

    def make_engine(self, ctx):
        return MisbehavingEngine(ctx.engine_config)

    def post(self, body, path="/"):
        return self.fetch(path, method="POST", body=json.dumps(body), headers={"Content-Type": "application/json"},
                          raise_error=False, request_timeout=20)

    def frames(self, resp):
        assert resp.code == 200, resp.body
        return [json.loads(line[len("data:"):]) for line in resp.body.decode().split("\n") if line.startswith("data:")]

    def error(self, resp, status, error_type):
        assert resp.code == status, (resp.code, resp.body)
        body = json.loads(resp.body)
        assert body["error_type"] == error_type
        return body["error"]


class GenerationFailures(Misbehaving):
    def test_engine_failure_is_424_and_the_server_keeps_serving(self):
        self.error(self.post({"inputs": "fail@0"}), 424, "generation")
        self.error(self.post({"inputs": "crash@1"}, "/generate"), 424, "generation")
        assert self.post({"inputs": "fine", "parameters": {"max_new_tokens": 3}}).code == 200
        assert self.fetch("/health").code == 200
        assert self.ctx.in_flight == 0

    def test_error_after_the_stream_started_is_a_final_sse_frame(self):
        frames = self.frames(self.post({"inputs": "fail@2", "stream": True, "parameters": {"max_new_tokens": 5}}))
        assert [("token" in f) for f in frames] == [True, True, False]
        assert frames[-1] == {"error": "the device fell over", "error_type": "generation"}
        frames = self.frames(self.post({"inputs": "fail@1", "parameters": {"max_new_tokens": 5}}, "/generate_stream"))
        assert frames[-1]["error_type"] == "generation" and len(frames) == 2

    def test_error_before_the_first_token_of_a_stream_is_a_plain_http_error(self):
        self.error(self.post({"inputs": "fail@0", "stream": True}), 424, "generation")


    def test_503_while_loading_and_when_the_engine_died(self):
        self.ctx.ready = False
        self.error(self.post({"inputs": "fine"}), 503, "healthcheck")
        self.error(self.fetch("/health"), 503, "healthcheck")
        self.ctx.ready = True
        self.engine.alive = False
        self.error(self.fetch("/health"), 503, "healthcheck")
        self.error(self.fetch("/v2/health/ready"), 503, "healthcheck")
        self.error(self.post({"inputs": "fine"}), 503, "healthcheck")
        assert self.fetch("/v2/health/live").code == 200
        self.engine.alive = True
        assert self.fetch("/health").code == 200

    def test_failures_are_counted_in_metrics(self):
        self.post({"inputs": "fail@0"})
        self.post({"inputs": "fine", "parameters": {"max_new_tokens": 2}})
        text = self.fetch("/metrics").body.decode()
        assert 'request_failed_total{model_name="mock"} 1.0' in text
        assert 'request_success_total{model_name="mock"} 1.0' in text
        assert 'request_received_total{model_name="mock"} 2.0' in text

    def test_the_mock_is_an_engine_client_and_the_server_reads_its_facts(self):
        assert isinstance(self.engine, EngineClient)
        info = json.loads(self.fetch("/info").body)
        assert info["model_device_reason"] == "StandardMock: no model" and info["model_dtype"] == "torch.float32"
        assert info["adapters"] == [] and info["modalities"] == []
        models = json.loads(self.fetch("/v1/models").body)["data"]
        assert [m["id"] for m in models] == ["mock"]
        r = self.post({"lora_name": "a", "lora_path": "/nowhere"}, "/v1/load_lora_adapter")
        assert "StandardMock" in self.error(r, 422, "validation")
        r = self.fetch("/v1/tokenizer", method="POST", body=json.dumps({"inputs": "ab"}),
                       headers={"Content-Type": "application/json"})
        assert json.loads(r.body) == {"token_number": 3, "tokens": [1, 100, 101]}

    def test_watermark_is_a_422_on_every_route(self):
        for path in ("/", "/generate", "/generate_stream"):
            msg = self.error(self.post({"inputs": "fine", "parameters": {"watermark": True}}, path), 422, "validation")
            assert "watermark" in msg and "not supported" in msg
        assert self.post({"inputs": "fine", "parameters": {"watermark": False, "max_new_tokens": 2}}).code == 200

    def test_input_processor_limits_apply_to_the_mock(self):
        # maxInputTokenLen 128: the mock's tokens are bytes plus <s>.
        msg = self.error(self.post({"inputs": "x" * 200}), 422, "validation")
        assert "at most 128 tokens" in msg and "got 201 tokens" in msg
        ok = self.post({"inputs": "x" * 200, "parameters": {"truncate": 100, "details": True, "max_new_tokens": 1}})
        assert json.loads(ok.body)[0]["details"]["prompt_tokens"] == 100
        assert "adapter_id" in self.error(self.post({"inputs": "fine", "parameters": {"adapter_id": "x"}}), 422,
                                          "validation")

    def test_too_many_headers_is_400(self):
        headers = {f"X-H{i}": "v" for i in range(120)}
        headers["Content-Type"] = "application/json"
        r = self.fetch("/", method="POST", body='{"inputs": "fine"}', headers=headers, raise_error=False)
        assert "too many HTTP headers" in self.error(r, 400, "validation")


class TokenTimeout(Misbehaving):
    server = {"tokenTimeout": 0.4, "e2eTimeout": 60, "maxLinkNum": 8}

    def test_token_timeout_is_504(self):
        msg = self.error(self.post({"inputs": "stall"}), 504, "timeout")
        assert "tokenTimeout" in msg


class EndToEndTimeout(Misbehaving):
    server = {"tokenTimeout": 30, "e2eTimeout": 2, "maxLinkNum": 8}

    def test_e2e_timeout_is_504_and_a_final_frame_once_streaming(self):
        msg = self.error(self.post({"inputs": "steady", "parameters": {"max_new_tokens": 60}}), 504, "timeout")
        assert "e2eTimeout" in msg
        frames = self.frames(self.post({"inputs": "steady", "stream": True, "parameters": {"max_new_tokens": 60}}))
        assert frames[-1]["error_type"] == "timeout" and len(frames) > 1


class RestStreamFailure(Misbehaving):
    def test_an_error_after_the_stream_started_truncates_the_chunked_body(self):
        """/api/* streams a chunked body: an error after its first chunk ends the body without its last chunk
        (the client sees the response is incomplete), and it is logged. The engine fails before token 2: no
        timer decides it (this was an e2eTimeout of 0.5 s on a server process, which a slow machine could pass
        before the first chunk and a fast one after the last)."""
        from tests.integration.test_server_rest import raw_chunks
        here = SimpleNamespace(url=lambda: f"http://127.0.0.1:{self.get_http_port()}")
        body = {"request_id": "r1", "prompt": "fail@2", "generation_config": {"max_new_tokens": 8}}
        with self.assertLogs("mindie_service.server.handlers_rest", "WARNING") as logs:
            status, _, chunks, complete = self.io_loop.run_sync(
                lambda: asyncio.get_running_loop().run_in_executor(None, raw_chunks, here, body), timeout=60)
        assert status == 200 and len(chunks) >= 1 and not complete
        assert any("error after the stream started" in line for line in logs.output)

"""Looking like vLLM from outside, over HTTP on the tiny model (issue 47): vLLM's published Grafana dashboard
(tests/data/vllm/grafana.json) finds every metric it queries on our metrics port after traffic, under vLLM's labels
and buckets; and each sequence arrives at an in-process OTLP/HTTP receiver as a span with vLLM's gen_ai.*
attributes, parented by the request's W3C traceparent."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client.parser import text_string_to_metric_families
from tornado.testing import gen_test

from mindie_service.devkit.presets import build_demo_model
from mindie_service.engine.async_engine import AsyncEngine
from mindie_service.server.context import ServerContext
from tests.inprocess import InProcessServer

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "tests" / "data" / "vllm" / "grafana.json"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"
# vllm/v1/metrics/buckets.py (vLLM 0.33)
TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
        80.0, 160.0, 640.0, 2560.0]
LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
           960.0, 1920.0, 7680.0]


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP traces endpoint: each POST /v1/traces body decoded (protobuf) and kept."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                msg = ExportTraceServiceRequest()
                msg.ParseFromString(body)
                if self.path == "/v1/traces" and self.headers["Content-Type"] == "application/x-protobuf":
                    outer.requests.append(msg)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    def spans(self) -> list:
        return [s for r in self.requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]


def dashboard_metrics() -> set[str]:
    exprs = []

    def walk(panel: dict) -> None:
        exprs.extend(t["expr"] for t in panel.get("targets", []) if "expr" in t)
        for p in panel.get("panels", []):
            walk(p)
    for p in json.loads(DASHBOARD.read_text())["panels"]:
        walk(p)
    return {m for e in exprs for m in re.findall(r"vllm:[A-Za-z0-9_:]+", e)}


class VllmFace(InProcessServer):
    @classmethod
    def setUpClass(cls) -> None:
        cls.receiver = Receiver()
        threading.Thread(target=cls.receiver.serve_forever, daemon=True).start()
        cls.server = {"otlpTracesEndpoint": f"http://127.0.0.1:{cls.receiver.server_port}/v1/traces",
                      "openAiSupport": "vllm"}

    @classmethod
    def tearDownClass(cls) -> None:
        cls.receiver.shutdown()
        cls.receiver.server_close()

    def make_engine(self, ctx: ServerContext) -> AsyncEngine:
        model = ROOT / "models" / "tiny"
        build_demo_model("tiny", str(model), if_missing=True)
        cfg = dataclasses.replace(ctx.engine_config, model=str(model), model_name="mock", cache_block_size=4,
                                  num_kv_blocks=96, max_batch_size=4, max_prefill_batch_size=4,
                                  max_queue_delay_microseconds=0)
        return AsyncEngine(cfg)

    def tearDown(self) -> None:
        self.ctx.tracer.close()
        super().tearDown()

    def post(self, path: str, body: dict, **headers: str):
        return self.http_client.fetch(self.get_url(path), method="POST", body=json.dumps(body), raise_error=False,
                                      headers={"Content-Type": "application/json", **headers}, request_timeout=60)

    async def traffic(self) -> list:
        prompt = {"model": "mock", "prompt": "the mill by the river", "max_tokens": 6, "temperature": 0,
                  "ignore_eos": True}
        chat = {"model": "mock", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5,
                "stream": True, "ignore_eos": True}
        first = await self.post("/v1/completions", prompt, traceparent=f"00-{TRACE_ID}-{PARENT_SPAN}-01")
        # the same prompt again once the first is cached, beside a streamed chat
        return [first, *await asyncio.gather(self.post("/v1/completions", prompt),
                                             self.post("/v1/chat/completions", chat))]

    @gen_test(timeout=60)
    async def test_every_metric_of_vllms_dashboard_is_served_and_spans_carry_vllms_attributes(self):
        resps = await self.traffic()
        assert [r.code for r in resps] == [200] * 3, [r.body[:300] for r in resps]
        text = (await self.http_client.fetch(self.get_url("/metrics"))).body.decode()
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        samples = {s.name: s for f in fams.values() for s in f.samples}
        wanted = dashboard_metrics()
        assert len(wanted) >= 20 and not wanted - samples.keys(), sorted(wanted - samples.keys())
        # after traffic, with vLLM's labels: three requests, 6 + 6 + 5 tokens, every phase observed
        lab = {"model_name": "mock", "engine": "0"}

        def value(name: str, **extra: str) -> float:
            return next(s.value for f in fams.values() for s in f.samples if s.name == name and s.labels == {
                **lab, **extra})
        assert value("vllm:request_success_total", finished_reason="length") == 3
        assert value("vllm:generation_tokens_total") == 17 == value("vllm:request_generation_tokens_sum")
        assert value("vllm:prompt_tokens_total") == value("vllm:request_prompt_tokens_sum") > 0
        assert value("vllm:prefix_cache_queries_total") == value("vllm:prompt_tokens_total")
        assert value("vllm:prefix_cache_hits_total") >= 4  # the second identical prompt reuses a full block
        for h in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
                  "request_prefill_time_seconds", "request_decode_time_seconds", "request_inference_time_seconds",
                  "request_time_per_output_token_seconds", "request_params_n"):
            assert value(f"vllm:{h}_count") == 3, h
        assert value("vllm:inter_token_latency_seconds_count") == 14  # (6 - 1) + (6 - 1) + (5 - 1)
        assert value("vllm:iteration_tokens_total_sum") == value("vllm:prompt_tokens_total") + 17
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                     "vllm:spec_decode_num_drafts"):  # the gateway's and speculation's vllm:* under vLLM's labels too
            assert [x.labels for x in fams[name].samples] == [lab], name
        assert fams["vllm:iteration_tokens_total"].type == "histogram"
        assert fams["vllm:num_preemptions"].type == "counter"

        def bounds(name: str) -> list[float]:
            return [float(s.labels["le"]) for s in fams[name].samples
                    if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"]
        assert bounds("vllm:time_to_first_token_seconds") == TTFT
        assert bounds("vllm:e2e_request_latency_seconds") == LATENCY
        assert bounds("vllm:request_prompt_tokens") == [1, 2, 5, 10, 20, 50, 100, 200]  # to maxSeqLen 256
        await asyncio.get_running_loop().run_in_executor(None, self.ctx.tracer.provider.force_flush)
        spans = self.receiver.spans()
        assert len(spans) == 3 and {s.name for s in spans} == {"llm_request"}
        (traced,) = [s for s in spans if s.trace_id.hex() == TRACE_ID]
        assert traced.parent_span_id.hex() == PARENT_SPAN and traced.kind == traced.SPAN_KIND_SERVER
        attrs = {a.key: a.value for a in traced.attributes}
        assert attrs["gen_ai.usage.completion_tokens"].int_value == 6
        assert attrs["gen_ai.usage.prompt_tokens"].int_value > 0
        assert attrs["gen_ai.response.model"].string_value == "mock"
        assert attrs["gen_ai.request.id"].string_value
        assert attrs["gen_ai.request.max_tokens"].int_value == 6
        e2e, ttft = attrs["gen_ai.latency.e2e"].double_value, attrs["gen_ai.latency.time_to_first_token"].double_value
        queue = attrs["gen_ai.latency.time_in_queue"].double_value
        assert 0 <= queue < e2e and 0 < ttft <= e2e
        assert traced.end_time_unix_nano - traced.start_time_unix_nano == round(e2e * 1e9) or abs(
            (traced.end_time_unix_nano - traced.start_time_unix_nano) / 1e9 - e2e) < 1e-3
        others = [s for s in spans if s.trace_id.hex() != TRACE_ID]
        assert all(not s.parent_span_id for s in others)  # no traceparent: a root span each

"""Request spans over OTLP/gRPC, vLLM's default protocol (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc): received by an
in-process gRPC collector (grpcio's server with opentelemetry-proto's TraceService), with vLLM's attributes and the
request's traceparent as parent; a protocol nobody speaks is refused naming the variable."""
from __future__ import annotations

from concurrent import futures

import pytest

from mindie_service.errors import ConfigError
from mindie_service.serving.observer import SequenceRecord

grpc = pytest.importorskip("grpc")
trace_service_pb2 = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")
trace_service_pb2_grpc = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc")

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


class _Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list = []

    def Export(self, request, context):  # noqa: N802 (the service's method name)
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                self.spans.extend(ss.spans)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def collector():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    col = _Collector()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(col, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield col, f"http://127.0.0.1:{port}"
    server.stop(None)


def test_spans_arrive_over_grpc(collector, monkeypatch):
    from mindie_service.server.tracing import RequestTracer

    col, endpoint = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    tracer = RequestTracer(endpoint)  # a gRPC server: only the gRPC exporter can reach it
    rec = SequenceRecord("req-1", "tiny", prompt_tokens=5, generated=3, cached_tokens=0, finish_reason="length",
                         t0=10.0, end=10.5, first=10.1, last=10.4, max_tokens=3,
                         trace_headers={"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"})
    tracer.observe_record(rec)
    tracer.close()  # flushes the batch: the export has been answered when it returns
    (span,) = col.spans
    attrs = {a.key: a.value for a in span.attributes}
    assert span.name == "llm_request" and span.trace_id.hex() == TRACE_ID
    assert attrs["gen_ai.request.id"].string_value == "req-1"
    assert (attrs["gen_ai.usage.prompt_tokens"].int_value, attrs["gen_ai.usage.completion_tokens"].int_value) == (5, 3)
    assert attrs["gen_ai.latency.time_to_first_token"].double_value == pytest.approx(0.1)


def test_an_unknown_protocol_is_refused_by_name(monkeypatch):
    from mindie_service.server.tracing import RequestTracer

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='http/json'"):
        RequestTracer("http://127.0.0.1:9")

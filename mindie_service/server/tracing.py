"""OpenTelemetry request spans, as vLLM sends them (``vllm/v1/engine/output_processor.py``, ``do_tracing``): one
span ``llm_request`` (kind SERVER) per generated sequence, from the call's arrival to its end, with vLLM's
``gen_ai.*`` attributes (``vllm/tracing/utils.py`` SpanAttributes), its parent the request's W3C ``traceparent``
(and ``tracestate``) header, exported over OTLP to ServerConfig.otlpTracesEndpoint (vLLM's
``--otlp-traces-endpoint``) by a batching span processor (off the IO loop). The protocol is vLLM's switch, the
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` variable: ``http/protobuf`` (the default here, as before) or ``grpc``
(vLLM's default); any other value is refused at start, naming the variable.

Off by default, and then free: nothing here is imported by the server unless the endpoint is set, and handlers
keep no trace context (``serving.observer.TRACE_HEADERS`` stays unset). OpenTelemetry's SDK and exporter come with
the ``tracing`` extra; a server configured for traces without them refuses to start, saying so."""
from __future__ import annotations

import logging
import os
import time
from typing import Any

from mindie_service.errors import ConfigError
from mindie_service.serving.observer import NullObserver, SequenceRecord

logger = logging.getLogger(__name__)

SPAN_NAME = "llm_request"
TRACE_HEADERS = ("traceparent", "tracestate")  # W3C trace context, as vLLM reads it
PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"  # vLLM's (and OpenTelemetry's) name for the switch
_EXPORTERS = {"http/protobuf": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
              "grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"}


def span_exporter(endpoint: str, protocol: str | None = None) -> Any:
    """The OTLP span exporter for ``protocol`` (None: the environment's, else http/protobuf), as vLLM's
    ``get_span_exporter`` picks it; ConfigError for a protocol nobody serves or a missing package."""
    import importlib

    proto = protocol or os.environ.get(PROTOCOL_ENV) or "http/protobuf"
    if proto not in _EXPORTERS:
        raise ConfigError(f"{PROTOCOL_ENV}={proto!r} is not a trace protocol this server speaks: "
                          f"{' or '.join(sorted(_EXPORTERS))}")
    try:
        module = importlib.import_module(_EXPORTERS[proto])
    except ImportError as e:
        raise ConfigError(f"ServerConfig.otlpTracesEndpoint is set but OpenTelemetry's {proto} exporter is not "
                          f"installed ({e.name}): pip install 'mindie-service[tracing]'") from None
    return module.OTLPSpanExporter(endpoint=endpoint)


class RequestTracer(NullObserver):  # it reads only the full records (observe_record)
    """A ``RequestObserver`` that ends each sequence's record as a span (serving.observer.SequenceRecord)."""

    def __init__(self, endpoint: str, service_name: str = "mindie-service", protocol: str | None = None) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace import SpanKind
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError as e:
            raise ConfigError(f"ServerConfig.otlpTracesEndpoint is set but OpenTelemetry is not installed ({e.name}): "
                              "pip install 'mindie-service[tracing]'") from None
        # a provider of our own (never the process-global one): the server's spans only, flushed on close
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        exporter = span_exporter(endpoint, protocol)
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("mindie_service")
        self.kind = SpanKind.SERVER
        self.propagator = TraceContextTextMapPropagator()
        logger.info("request spans go to %s (OTLP, %s)", endpoint, type(exporter).__module__.split(".")[-2])

    def observe_record(self, rec: SequenceRecord) -> None:
        # the record's times are monotonic; a span's are the wall clock's nanoseconds
        shift = time.time() - time.monotonic()
        parent = self.propagator.extract(dict(rec.trace_headers)) if rec.trace_headers else None
        span = self.tracer.start_span(SPAN_NAME, context=parent, kind=self.kind, attributes=span_attributes(rec),
                                      start_time=int((rec.t0 + shift) * 1e9))
        span.end(end_time=int((rec.end + shift) * 1e9))

    def close(self) -> None:
        """Send what is still batched, then stop the exporter (the server's drain)."""
        self.provider.shutdown()


def span_attributes(rec: SequenceRecord) -> dict[str, Any]:
    """vLLM's span attributes of one sequence (its latencies in seconds; the phases only where the engine told
    its queueing and scheduling times)."""
    a: dict[str, Any] = {"gen_ai.request.id": rec.request_id, "gen_ai.response.model": rec.model,
                         "gen_ai.usage.prompt_tokens": rec.prompt_tokens,
                         "gen_ai.usage.completion_tokens": rec.generated, "gen_ai.latency.e2e": rec.end - rec.t0,
                         "gen_ai.request.n": rec.n}
    if rec.max_tokens:
        a["gen_ai.request.max_tokens"] = rec.max_tokens
    if rec.temperature:
        a["gen_ai.request.temperature"] = rec.temperature
    if rec.top_p:
        a["gen_ai.request.top_p"] = rec.top_p
    if rec.first is not None:
        a["gen_ai.latency.time_to_first_token"] = rec.first - rec.t0
        last = rec.last if rec.last is not None else rec.first
        a["gen_ai.latency.time_in_model_decode"] = last - rec.first
        if rec.scheduled_at is not None and rec.queued_at is not None:
            a["gen_ai.latency.time_in_queue"] = rec.scheduled_at - rec.queued_at
            a["gen_ai.latency.time_in_model_prefill"] = rec.first - rec.scheduled_at
            a["gen_ai.latency.time_in_model_inference"] = last - rec.scheduled_at
    return a


def trace_headers(get: Any) -> dict[str, str] | None:
    """The W3C trace-context headers of a request (``get``: its headers' ``get``), or None without a traceparent."""
    out = {h: v for h in TRACE_HEADERS if (v := get(h))}
    return out if "traceparent" in out else None

"""Prometheus metrics under MindIE's names, in a per-app registry, each labelled ``model_name``.

Request counters and latency histograms are updated by the serving core, through its RequestObserver
interface (mindie_service.serving.observer), which ServiceMetrics implements; the engine gauges
(running / waiting / swapped, cache usage, prefix hit rate, preemptions) are read from
``engine.stats()`` at scrape time."""
from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mindie_service.server.metric_family import model_families, model_family
from mindie_service.server.spec_metrics import spec_families

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0)
_TPOT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 300.0, 600.0)


def _token_buckets(max_len: int) -> tuple[float, ...]:
    out: list[float] = []
    mant, exp = (1, 2, 5), 1
    while True:
        for m in mant:
            v = m * exp
            if v > max_len:
                return tuple(out)
            out.append(float(v))
        exp *= 10


class _EngineCollector(Collector):
    def __init__(self, model_name: str, stats: Callable[[], Any],
                 instances: Callable[[], Any] | None = None) -> None:
        self.model_name = model_name
        self.stats = stats
        self.instances = instances  # () -> [InstanceStatus] (fleet/instances.py) or None while loading

    def collect(self) -> Iterator[Metric]:
        s = self.stats()
        if s is None:  # engine still loading
            return
        label = [self.model_name]
        yield from model_families("gauge", label, (
            ("num_requests_running", "Requests running on the device (in the decode/prefill batch).", s.running),
            ("num_requests_waiting", "Requests waiting to be scheduled.", s.waiting),
            ("num_requests_swapped", "Requests preempted and waiting to resume.", s.swapped),
            ("num_batch_requests_running", "Of the running requests, batch-job lines.", s.batch_running),
            ("num_batch_requests_waiting", "Of the waiting requests, batch-job lines.", s.batch_waiting),
            ("npu_cache_usage_perc", "KV cache usage (1 = 100%).", s.cache_usage),
            ("npu_prefix_cache_hit_rate", "Prefix cache hit rate (0..1).", s.prefix_cache_hit_rate),
        ))
        yield model_family("counter", "num_preemptions", "Preemptions since start.", label, s.num_preemptions)
        # Kept sessions of the /api/* routes (continuation by request_id).
        yield model_family("gauge", "num_sessions_held", "Finished generations kept for continuation.", label,
                           getattr(s, "sessions_held", 0))
        yield from model_families("counter", label, (
            ("session_hits", "Continuations that found their session.", getattr(s, "session_hits", 0)),
            ("session_evictions", "Sessions that lost their pinned KV blocks or were dropped to stay within "
             "their bounds.", getattr(s, "session_evictions", 0))))
        yield from spec_families(label, s)
        yield from self._per_instance()

    def _per_instance(self) -> Iterator[Metric]:
        """BackendConfig.modelInstanceNumber: each instance's queues, cache and routed requests, labelled
        ``instance`` (0.. ; a single engine is instance 0). The families above are the instances' sums."""
        insts = self.instances() if self.instances is not None else None
        if not insts:
            return
        labels = ["model_name", "instance"]
        for name, doc, get in (
            ("instance_num_requests_running", "Requests running on this model instance.", lambda i: i.stats.running),
            ("instance_num_requests_waiting", "Requests waiting on this model instance.", lambda i: i.stats.waiting),
            ("instance_npu_cache_usage_perc", "KV cache usage of this model instance (1 = 100%).",
             lambda i: i.stats.cache_usage),
            ("instance_healthy", "1 while this model instance serves, else 0.", lambda i: 1.0 if i.healthy else 0.0),
        ):
            g = GaugeMetricFamily(name, doc, labels=labels)
            for i in insts:
                g.add_metric([self.model_name, str(i.index)], float(get(i)))
            yield g
        if insts[0].routed is not None:
            c = CounterMetricFamily("instance_requests_routed", "Requests the router sent to this model instance.",
                                    labels=labels)
            for i in insts:
                c.add_metric([self.model_name, str(i.index)], float(i.routed or 0))
            yield c


class ServiceMetrics:
    """The service's metrics; ``render()`` gives the Prometheus text of this app's registry only."""

    def __init__(self, model_name: str, stats: Callable[[], Any], max_seq_len: int = 2560,
                 instances: Callable[[], Any] | None = None) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        r, lab = self.registry, ["model_name"]

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, lab, registry=r).labels(model_name)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, doc, lab, buckets=buckets, registry=r).labels(model_name)

        self.request_received = counter("request_received", "Generation requests received.")
        self.request_success = counter("request_success", "Generation requests answered successfully.")
        self.request_failed = counter("request_failed", "Generation requests that ended in an error.")
        self.stream_aborted_slow_client = counter(
            "stream_aborted_slow_client", "Streams aborted because their client did not read them "
            "(more than ServerConfig.maxStreamBufferBytes unsent).")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        self.ttft = hist("time_to_first_token_seconds", "Time to first token.", _TTFT_BUCKETS)
        self.tpot = hist("time_per_output_token_seconds", "Time per output token after the first.", _TPOT_BUCKETS)
        self.e2e = hist("e2e_request_latency_seconds", "End-to-end request latency.", _E2E_BUCKETS)
        tok = _token_buckets(max(max_seq_len, 1))
        self.request_prompt_tokens = hist("request_prompt_tokens", "Prompt tokens per request.", tok)
        self.request_generation_tokens = hist("request_generation_tokens", "Generated tokens per request.", tok)
        r.register(_EngineCollector(model_name, stats, instances))

    def observe_received(self, n: int = 1) -> None:
        """``n`` generation requests arrived (serving.RequestObserver)."""
        self.request_received.inc(n)

    def observe_sequence(self, *, prompt_tokens: int, generated: int, ttft: float | None, e2e: float) -> None:
        """One finished engine sequence (a best_of request reports each of its sequences; its
        end-to-end latency is observed once, by ``observe_request``)."""
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generated)
        self.request_prompt_tokens.observe(prompt_tokens)
        self.request_generation_tokens.observe(generated)
        if ttft is not None:
            self.ttft.observe(ttft)
            if generated > 1:
                self.tpot.observe((e2e - ttft) / (generated - 1))

    def observe_record(self, rec: Any) -> None:
        """vLLM's families read the whole record (server/vllm_metrics.py); MindIE's have what they need."""

    def observe_request(self, *, ok: bool, e2e: float | None) -> None:
        """One generation request ended (``e2e`` only for a successful one)."""
        (self.request_success if ok else self.request_failed).inc()
        if ok and e2e is not None:
            self.e2e.observe(e2e)

    def track_admission(self, admitted: Callable[[], int], queued: Callable[[], int]) -> None:
        """Gauges of the admission queue (ServerConfig.maxLinkNum), read at scrape time."""
        for name, doc, fn in (("num_requests_admitted", "Generation requests admitted (at most maxLinkNum).", admitted),
                              ("num_requests_queued", "Generation requests waiting for admission (at most "
                               "2 x maxLinkNum).", queued)):
            Gauge(name, doc, ["model_name"], registry=self.registry).labels(self.model_name).set_function(fn)

    def render(self) -> bytes:
        return generate_latest(self.registry)

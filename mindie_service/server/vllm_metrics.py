"""vLLM v1's metric set under its names, types, labels and buckets (``vllm/v1/metrics/loggers.py``, vLLM 0.33),
beside MindIE's names on the metrics port, so that dashboards and autoscalers written for ``vllm serve`` read us.

Every family is labelled ``model_name`` and ``engine`` (the engine index: "0", one engine per server) as vLLM's
are; ``vllm:request_success_total`` also ``finished_reason`` (stop, length, abort, error). The request families
are fed by the serving core's sequence records (serving.observer.SequenceRecord, through ``observe_record``);
``vllm:num_preemptions_total`` and ``vllm:iteration_tokens_total`` are read from ``engine.stats()`` at scrape time.
The scheduler gauges, ``vllm:lora_requests_info`` and ``vllm:cache_config_info`` are the gateway's
(server/gateway_metrics.py), the ``vllm:spec_decode_*`` counters speculative decoding's (server/spec_metrics.py).

Times, as vLLM measures them: TTFT and end-to-end from the call's arrival; queue time from the engine's queueing
to its first scheduling; prefill from then to the first token; decode from the first token to the last;
inference = prefill + decode; inter-token latency between successive tokens."""
from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from mindie_service.engine.contract import STEP_TOKEN_BOUNDS
from mindie_service.serving.observer import NullObserver, SequenceRecord

ENGINE = "0"  # vLLM's engine label: the data-parallel engine index; one engine per server here
FINISH_REASONS = ("stop", "length", "abort", "error")  # vllm.v1.engine.FinishReason (less repetition: never ours)
LABELS = ["model_name", "engine"]

# vllm/v1/metrics/buckets.py
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)


def token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's request_tokens buckets: 1, 2, 5, 10, 20, 50, ... up to ``max_model_len`` (build_1_2_5_buckets)."""
    out: list[float] = []
    exp = 1
    while True:
        for m in (1, 2, 5):
            if m * exp > max_model_len:
                return tuple(out)
            out.append(float(m * exp))
        exp *= 10


class _EngineFamilies(Collector):
    """The families vLLM counts in its engine core, read from ``engine.stats()`` at scrape time."""

    def __init__(self, model_name: str, stats: Callable[[], Any]) -> None:
        self.model_name, self.stats = model_name, stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats()
        if s is None:  # the model is still loading
            return
        label = [self.model_name, ENGINE]
        c = CounterMetricFamily("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                                labels=LABELS)
        c.add_metric(label, float(s.num_preemptions))
        yield c
        steps = getattr(s, "iteration_tokens", None)
        h = HistogramMetricFamily("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                                  labels=LABELS)
        counts = steps.counts if steps is not None else (0,) * (len(STEP_TOKEN_BOUNDS) + 1)
        cumulative, buckets = 0, []
        for bound, k in zip([*map(str, map(float, STEP_TOKEN_BOUNDS)), "+Inf"], counts):
            cumulative += k
            buckets.append((bound, float(cumulative)))
        h.add_metric(label, buckets, float(steps.total if steps is not None else 0))
        yield h


class VllmMetrics(NullObserver):  # it reads only the full records (observe_record)
    """vLLM's request families in ``registry`` (the metrics port's); a ``RequestObserver`` of the serving core."""

    def __init__(self, registry: CollectorRegistry, model_name: str, stats: Callable[[], Any],
                 max_model_len: int) -> None:
        self.model_name = model_name
        r = registry
        tok = token_buckets(max(max_model_len, 1))

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, LABELS + list(extra), registry=r)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=r)

        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.request_success = counter("vllm:request_success", "Count of successfully processed requests.",
                                       ("finished_reason",))
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of "
                                      "queried tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.h: dict[str, Histogram] = {name: hist(f"vllm:{name}", doc, b) for name, doc, b in (
            ("request_prompt_tokens", "Number of prefill tokens processed.", tok),
            ("request_generation_tokens", "Number of generation tokens processed.", tok),
            ("request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.", tok),
            ("request_params_n", "Histogram of the n request parameter.", PARAMS_N_BUCKETS),
            ("request_params_max_tokens", "Histogram of the max_tokens request parameter.", tok),
            ("time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS),
            ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS),
            ("request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.",
             ITL_BUCKETS),
            ("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS),
            ("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
             REQUEST_LATENCY_BUCKETS),
            ("request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
             REQUEST_LATENCY_BUCKETS),
            ("request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
             REQUEST_LATENCY_BUCKETS),
            ("request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
             REQUEST_LATENCY_BUCKETS))}
        self._touch(model_name)  # the default model's series exist before any traffic, as vLLM's do
        r.register(_EngineFamilies(model_name, stats))

    def _touch(self, model: str) -> None:
        for c in (self.prompt_tokens, self.generation_tokens, self.prefix_queries, self.prefix_hits):
            c.labels(model, ENGINE)
        for reason in FINISH_REASONS:
            self.request_success.labels(model, ENGINE, reason)
        for h in self.h.values():
            h.labels(model, ENGINE)

    def _observe(self, name: str, model: str, value: float | None) -> None:
        if value is not None:
            self.h[name].labels(model, ENGINE).observe(max(0.0, value))

    # -- serving.observer.RequestObserver ------------------------------------------------------------
    def observe_record(self, rec: SequenceRecord) -> None:
        model = rec.model or self.model_name
        lab = (model, ENGINE)
        self.request_success.labels(*lab, rec.finish_reason).inc()
        self.generation_tokens.labels(*lab).inc(rec.generated)
        o = self._observe
        o("e2e_request_latency_seconds", model, rec.end - rec.t0)
        o("request_generation_tokens", model, rec.generated)
        o("request_max_num_generation_tokens", model, rec.max_tokens)
        o("request_params_max_tokens", model, rec.max_tokens)
        o("request_params_n", model, rec.n)
        if rec.first is None:  # no prompt was computed for it (refused or cut before its first token)
            return
        self.prompt_tokens.labels(*lab).inc(rec.prompt_tokens)
        self.prefix_queries.labels(*lab).inc(rec.prompt_tokens)
        self.prefix_hits.labels(*lab).inc(rec.cached_tokens)
        o("request_prompt_tokens", model, rec.prompt_tokens)
        o("time_to_first_token_seconds", model, rec.first - rec.t0)
        for gap in rec.gaps:
            self.h["inter_token_latency_seconds"].labels(*lab).observe(gap)
        last = rec.last if rec.last is not None else rec.first
        o("request_decode_time_seconds", model, last - rec.first)
        if rec.generated > 1:
            o("request_time_per_output_token_seconds", model, (last - rec.first) / (rec.generated - 1))
        if rec.scheduled_at is not None and rec.queued_at is not None:
            o("request_queue_time_seconds", model, rec.scheduled_at - rec.queued_at)
            o("request_prefill_time_seconds", model, rec.first - rec.scheduled_at)
            o("request_inference_time_seconds", model, last - rec.scheduled_at)

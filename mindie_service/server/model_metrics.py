"""Per-model residency metrics on the metrics port (issue 46), read from the catalog at scrape time: loads, load
seconds (a histogram), evictions by reason, sleeps, requests that waited for a load, each catalog model's state (a
state set: 1 for the state it is in) and its measured memory by part."""
from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from mindie_service.catalog.residency import Residency
from mindie_service.catalog.residency_stats import LOAD_SECONDS_BUCKETS

STATES = ("not_downloaded", "downloading", "downloaded", "starting", "running", "sleeping", "stopping", "stopped",
          "failed")


class ModelResidencyCollector(Collector):
    def __init__(self, residency: Residency) -> None:
        self.residency = residency

    def collect(self) -> Iterator[Metric]:
        entries = list(self.residency.catalog.entries.values())
        m = ["model_name"]
        loads = CounterMetricFamily("model_loads", "Loads of this catalog model that completed.", labels=m)
        failures = CounterMetricFamily("model_load_failures", "Loads of this catalog model that failed.", labels=m)
        waits = CounterMetricFamily("model_load_waits", "Requests that waited for this model to load.", labels=m)
        sleeps = CounterMetricFamily("model_sleeps", "Times this model was put to sleep (POST /sleep).", labels=m)
        evictions = CounterMetricFamily("model_evictions", "Unloads of this model by reason: idle "
                                        "(idleUnloadSeconds), keep_alive, max_loaded or budget (evicted for another "
                                        "model), requested (management port).", labels=m + ["reason"])
        seconds = HistogramMetricFamily("model_load_seconds", "Seconds each load of this model took.", labels=m)
        state = GaugeMetricFamily("model_state", "1 for the state each catalog model is in, else 0.",
                                  labels=m + ["state"])
        memory = GaugeMetricFamily("model_memory_bytes", "Memory this model took at its last load, measured "
                                   "(weights, kv_pool, workspace on the host; device on an accelerator; load_peak: the "
                                   "most the load held above its start at any moment); 0 before a load.",
                                   labels=m + ["part"])
        held = GaugeMetricFamily("model_resident_bytes", "What the fit check counts for this model while it is "
                                 "resident (measured, else the header estimate); 0 when not resident.", labels=m)
        for e in entries:
            c, lab = e.counters, [e.id]
            loads.add_metric(lab, c.loads)
            failures.add_metric(lab, c.load_failures)
            waits.add_metric(lab, c.load_waits)
            sleeps.add_metric(lab, c.sleeps)
            for reason, n in c.evictions.items():
                evictions.add_metric(lab + [reason], n)
            buckets = [(str(b), n) for b, n in zip(LOAD_SECONDS_BUCKETS, c.load_seconds_buckets)]
            seconds.add_metric(lab, buckets + [("+Inf", c.loads)], c.load_seconds_sum)
            for s in STATES:
                state.add_metric(lab + [s], 1.0 if e.state == s else 0.0)
            mem = e.memory.as_json() if e.memory is not None else {}
            for part in ("weights", "kv_pool", "workspace", "device", "load_peak"):
                memory.add_metric(lab + [part], float(mem.get(f"{part}_bytes", 0)))
            held.add_metric(lab, float(self.residency.held_bytes(e)) if self.residency.resident(e) else 0.0)
        yield from (loads, failures, waits, sleeps, evictions, seconds, state, memory, held)

"""The gateway's metric names beside MindIE's: what the Gateway API Inference Extension's model-server
protocol asks of a model server, under the names its reference configuration reads (vLLM's).

Per-server totals (an endpoint picker reads one pod as one endpoint; per-instance series stay under our
own ``instance_*`` names):

- ``vllm:num_requests_waiting``  requests queued: the engines' waiting and preempted (swapped) requests,
  plus those waiting for admission (``maxLinkNum``) in front of the engine
- ``vllm:num_requests_running``  requests in the engines' running batches
- ``vllm:kv_cache_usage_perc`` and the older ``vllm:gpu_cache_usage_perc``: used / all KV blocks, 0..1
- ``vllm:lora_requests_info``  value: the scrape's time; labels ``model_name``, ``max_lora``, ``running_lora_adapters``,
  ``waiting_lora_adapters`` (comma-separated adapter names)
- ``vllm:cache_config_info``  value 1; labels ``model_name``, ``block_size``, ``num_gpu_blocks``, ``num_cpu_blocks``,
  ``cache_dtype``, ``enable_prefix_caching``
- ``kv_events_published_batches`` / ``kv_events_dropped_batches`` (ours): the KV-event publisher's counts"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mindie_service.fleet.gateway_view import GatewayState
from mindie_service.server.metric_family import model_families


class GatewayCollector(Collector):
    def __init__(self, model_name: str, state: Callable[[], GatewayState | None],
                 queued: Callable[[], int] = lambda: 0) -> None:
        self.model_name = model_name
        self.state = state  # None while the model loads
        self.queued = queued  # requests waiting for admission

    def collect(self) -> Iterator[Metric]:
        s = self.state()
        if s is None:
            return
        label = [self.model_name]
        yield from model_families("gauge", label, (
            ("vllm:num_requests_waiting", "Requests queued (engine waiting + preempted + admission queue).",
             s.waiting + self.queued()),
            ("vllm:num_requests_running", "Requests in the running batches.", s.running),
            ("vllm:kv_cache_usage_perc", "KV-cache usage, 0..1 (1 = every block in use).", s.kv_cache_usage),
            ("vllm:gpu_cache_usage_perc", "KV-cache usage, 0..1 (the older name).", s.kv_cache_usage),
        ))
        lora = GaugeMetricFamily("vllm:lora_requests_info", "LoRA adapters of running and waiting requests; value: "
                                 "the time of this reading.",
                                 labels=["model_name", "max_lora", "running_lora_adapters", "waiting_lora_adapters"])
        lora.add_metric([self.model_name, str(s.max_lora), ",".join(s.running_adapters), ",".join(s.waiting_adapters)],
                        time.time())
        yield lora
        info = GaugeMetricFamily("vllm:cache_config_info", "The KV cache's configuration (value 1).",
                                 labels=["model_name", "block_size", "num_gpu_blocks", "num_cpu_blocks", "cache_dtype",
                                         "enable_prefix_caching"])
        info.add_metric([self.model_name, str(s.block_size), str(s.num_gpu_blocks), str(s.num_cpu_blocks),
                         s.cache_dtype, str(s.enable_prefix_caching)], 1.0)
        yield info
        yield from model_families("counter", label, (
            ("kv_events_published_batches", "KV-event batches sent (BackendConfig.kvEventsConfig).",
             s.kv_events_published),
            ("kv_events_dropped_batches", "KV-event batches dropped because the publisher's queue was full.",
             s.kv_events_dropped),
        ))


def gateway_json(g: GatewayState) -> dict[str, Any]:
    """The same figures for GET /v1/status (management port)."""
    return {"lora": {"maxLora": g.max_lora, "runningAdapters": list(g.running_adapters),
                     "waitingAdapters": list(g.waiting_adapters)},
            "cacheConfig": {"blockSize": g.block_size, "numGpuBlocks": g.num_gpu_blocks,
                            "numCpuBlocks": g.num_cpu_blocks, "cacheDtype": g.cache_dtype,
                            "enablePrefixCaching": g.enable_prefix_caching},
            "kvEvents": {"publishedBatches": g.kv_events_published, "droppedBatches": g.kv_events_dropped}}

"""One builder for the scrape-time families every collector yields: a gauge or counter labelled
``model_name`` with one sample (MindIE's, the gateway's and speculative decoding's families share it)."""
from __future__ import annotations

from typing import Iterable, Iterator, Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

Kind = Literal["gauge", "counter"]


def model_family(kind: Kind, name: str, doc: str, label: list[str], value: float) -> Metric:
    """A family under ``model_name``; a ``vllm:*`` one also under vLLM's ``engine`` (the engine index, "0":
    one engine per server), as vLLM labels its own (server/vllm_metrics.py)."""
    cls = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
    vllm = name.startswith("vllm:")
    family = cls(name, doc, labels=["model_name", "engine"] if vllm else ["model_name"])
    family.add_metric([*label, "0"] if vllm else label, float(value))
    return family


def model_families(kind: Kind, label: list[str], rows: Iterable[tuple[str, str, float]]) -> Iterator[Metric]:
    """``rows``: (name, doc, value) each."""
    for name, doc, value in rows:
        yield model_family(kind, name, doc, label, value)

"""One builder for the scrape-time families every collector yields: a gauge or counter labelled
``model_name`` with one sample (MindIE's, the gateway's and speculative decoding's families share it)."""
from __future__ import annotations

from typing import Iterable, Iterator, Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

Kind = Literal["gauge", "counter"]


def model_family(kind: Kind, name: str, doc: str, label: list[str], value: float) -> Metric:
    cls = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
    family = cls(name, doc, labels=["model_name"])
    family.add_metric(label, float(value))
    return family


def model_families(kind: Kind, label: list[str], rows: Iterable[tuple[str, str, float]]) -> Iterator[Metric]:
    """``rows``: (name, doc, value) each."""
    for name, doc, value in rows:
        yield model_family(kind, name, doc, label, value)

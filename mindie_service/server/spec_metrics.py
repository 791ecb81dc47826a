"""Speculative decoding's Prometheus families, read from ``engine.stats()`` at scrape time: vLLM's names
(``vllm:spec_decode_num_drafts`` / ``_num_draft_tokens`` / ``_num_accepted_tokens``, counters) beside
MindIE-style unprefixed ones, and the mean accepted length (tokens a verify row yields: 1 + accepted
drafts per row). Nothing is yielded by an engine without the fields (a mock)."""
from __future__ import annotations

from typing import Any, Iterator

from prometheus_client.core import Metric

from mindie_service.server.metric_family import model_family

_COUNTERS = (
    ("spec_decode_num_drafts", "spec_num_drafts", "Verify rows that carried draft tokens."),
    ("spec_decode_num_draft_tokens", "spec_num_draft_tokens", "Draft tokens proposed and verified."),
    ("spec_decode_num_accepted_tokens", "spec_num_accepted_tokens", "Draft tokens the target accepted."),
)


def spec_families(label: list[str], stats: Any) -> Iterator[Metric]:
    if not hasattr(stats, "spec_num_drafts"):
        return
    for name, attr, doc in _COUNTERS:
        value = float(getattr(stats, attr))
        for full in (f"vllm:{name}", name):
            yield model_family("counter", full, doc, label, value)
    yield model_family("gauge", "spec_decode_mean_accepted_length",
                       "Tokens a verify row yields on average (1 + its accepted drafts); 0 before any.", label,
                       stats.spec_mean_accepted_length)

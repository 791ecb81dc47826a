"""A load's peak (catalog/memory_meter.py): the RSS's high-water mark over the load, reset at its start, counts what
the load held and gave back before it ended (the checkpoint's pages while read, copies not yet freed), which the
RSS before and after misses; the fit check counts the peak (test_residency.BudgetTest)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from mindie_service.catalog.memory_meter import LoadMeter, reset_peak_rss

pytestmark = pytest.mark.skipif(not reset_peak_rss(), reason="no /proc/self/clear_refs here: no peak is measured")


def test_the_peak_counts_what_the_load_freed_before_it_ended() -> None:
    before = b"\x03" * (192 << 20)  # the process peaked higher before the load: not the load's
    del before
    meter = LoadMeter()
    meter.begin()
    transient = b"\x01" * (64 << 20)  # written: resident (a mapping of its own, given back when freed)
    del transient
    kept = b"\x02" * (8 << 20)
    meter.built()
    meter.warmed()
    got = meter.result(SimpleNamespace(stats=lambda: SimpleNamespace(kv_pool_bytes=0)), mock=True)
    assert (64 << 20) - (2 << 20) <= got.peak < 128 << 20, got.as_json()
    assert got.total < 32 << 20 and got.load_need == got.peak, got.as_json()
    assert len(kept) == 8 << 20

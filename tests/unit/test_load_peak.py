"""A load's peak (catalog/memory_meter.py): the highest RSS read while the load runs (a thread of the meter's reads it
every few milliseconds; here the test takes the reading itself) counts what the load held and gave back before it
ended (the checkpoint's pages while read, copies not yet freed), which the RSS before and after misses, and nothing
the process held before the load; the fit check counts the peak (test_residency.BudgetTest)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from mindie_service.catalog import memory_meter
from mindie_service.catalog.memory_meter import LoadMeter


def test_the_peak_counts_what_the_load_freed_before_it_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_meter, "SAMPLE_S", 3600.0)  # the thread's readings wait: the test reads by hand
    before = b"\x03" * (192 << 20)  # the process peaked higher before the load: not the load's
    del before
    meter = LoadMeter()
    meter.begin()
    transient = b"\x01" * (64 << 20)  # written: resident (a mapping of its own, given back when freed)
    meter.sample()  # (the meter's thread, every SAMPLE_S)
    del transient
    kept = b"\x02" * (8 << 20)
    meter.built()
    meter.warmed()
    got = meter.result(SimpleNamespace(stats=lambda: SimpleNamespace(kv_pool_bytes=0)), mock=True)
    assert (64 << 20) - (2 << 20) <= got.peak < 128 << 20, got.as_json()
    assert got.total < 32 << 20 and got.load_need == got.peak, got.as_json()
    assert len(kept) == 8 << 20

"""The ready line (log and banner) says the KV pool's size and the process's RSS (issue 43)."""
from __future__ import annotations

import re
import sys

import pytest

from mindie_service.devkit.mock_engine import TOTAL_BLOCKS, MockEngine
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.server.main import memory_facts, rss_bytes


def test_the_ready_facts_name_the_pool_and_the_rss() -> None:
    facts = memory_facts(MockEngine(EngineConfig(model="none", model_name="mock")), 16)
    m = re.fullmatch(r"KV pool (\d+) blocks \((\d+) tokens\), RSS (\d+) MiB", facts)
    assert m, facts
    assert int(m.group(1)) == TOTAL_BLOCKS and int(m.group(2)) == TOTAL_BLOCKS * 16
    assert 10 < int(m.group(3)) < 100_000


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_rss_is_the_current_resident_memory() -> None:
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    rss = rss_bytes()
    assert rss is not None and abs(rss - vm) < 0.2 * vm

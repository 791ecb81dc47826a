"""The fused decoder team's barrier (npu_ops/csrc/team_sync.c): every thread's plain stores before it are seen by
every other thread after it, at any team size, round after round (a barrier that let a thread through early, or
published its arrival before its stores, shows stale values here)."""
from __future__ import annotations

import pytest

from npu_ops import cpu_kernels

pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_team_barrier_publishes_every_threads_writes(threads):
    assert cpu_kernels.load().team_sync_check(threads, 20000) == 0

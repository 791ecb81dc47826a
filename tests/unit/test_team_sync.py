"""The fused decoder team's barrier (npu_ops/csrc/team_sync.c): every thread's plain stores before it are seen by
every other thread after it, at any team size, round after round (a barrier that let a thread through early, or
published its arrival before its stores, shows stale values here)."""
from __future__ import annotations

import ctypes

import pytest

from npu_ops import cpu_kernels

pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_team_barrier_publishes_every_threads_writes(threads):
    assert cpu_kernels.load().team_sync_check(threads, 20000) == 0


@pytest.mark.parametrize("threads,total,want", [(1, 40, 4), (2, 37, 4), (3, 100, 3), (4, 64, 1)])
def test_team_work_takes_every_unit_once_and_steals_from_a_slow_thread(threads, total, want):
    """team_work_* (the W8A8 row kernels' split): every unit is taken exactly once a phase, whether its owner or a
    thief takes it, and a thread that finished its share takes units left in a slow thread's share."""
    stolen = ctypes.c_int64(-1)
    assert cpu_kernels.load().team_work_check(threads, total, want, 300, ctypes.byref(stolen)) == 0
    assert (stolen.value > 0) == (threads > 1)

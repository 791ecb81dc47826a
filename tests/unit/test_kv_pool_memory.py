"""npu_ops.memory.zeros reads as zeros (its pages are faulted in at allocation, on huge pages where THP applies:
leaving them to the first write cost 6.5% of tools/bench_commits.py's engine throughput, in first-touch faults
during the requests)."""
from __future__ import annotations

import torch

from npu_ops import memory


def test_a_small_pool_reads_as_zeros() -> None:
    assert not memory.zeros((3, 5, 7), torch.float32, torch.device("cpu")).any()

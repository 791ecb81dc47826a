"""A KV pool on the CPU holds host memory for the blocks written so far, not for all of it (issue 43: a 135M
model's server held its whole 2 GiB pool in RSS at ready): npu_ops.memory.zeros hands out a fresh anonymous
mapping, zero already, without writing it."""
from __future__ import annotations

import os
import sys

import pytest
import torch

from npu_ops import memory

MIB = 1 << 20


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RSS from /proc; elsewhere a plain torch.zeros")
def test_a_fresh_pool_takes_host_memory_only_as_it_is_written() -> None:
    before = _rss()
    pool = memory.zeros((256, MIB // 4), torch.float32, torch.device("cpu"))  # 256 MiB, 1 MiB per row
    assert _rss() - before < 32 * MIB, "the whole pool was faulted in at allocation"
    pool[3].fill_(1.5)  # a block written: its pages come in
    assert _rss() - before < 48 * MIB
    assert float(pool[3].sum()) == 1.5 * (MIB // 4)
    assert not pool[0:2].any() and not pool[200].any()  # unwritten memory reads as zeros


def test_a_small_pool_reads_as_zeros() -> None:
    assert not memory.zeros((3, 5, 7), torch.float32, torch.device("cpu")).any()

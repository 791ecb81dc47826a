"""A GGUF projection's team (csrc/gguf_linear.c) quantizes x once for all its threads (issue 44): from 2 rows of x
on, each thread quantizes its share of x's rows into the caller's work, in the layout its segments' int8 kernels
read (GGUF_XQ_Q8: Q4_0, Q4_1, Q4_1F, Q8_0, Q5_0, Q5_1; GGUF_XQ_Q8K: the K-quants), and every kernel finds it there instead of
quantizing all of x itself. The quantization is per row and deterministic, so each output keeps the bits of the
type's own kernel called alone (which quantizes x itself), at any row count and thread count. The tiles' panels of
a prefill piece on fp32 activations come from the same work: no tile call mallocs its own (a worker's block stays
in its glibc arena)."""
from __future__ import annotations

import pytest
import torch

from npu_ops import cpu_kernels, gguf_cpu
from npu_ops.gguf_modules import INT8_ALL, STEP_DECODE, STEP_PREFILL
from npu_ops.quant_gguf import GgufWeight
from tests.unit.test_gguf_kquant import weights as kquant_weights
from tests.unit.test_gguf_q5 import random_weight as q5_weight
from tests.unit.test_gguf_q8 import activations, at_threads, random_weight

pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")
K = 512


def kquant(kind: str, n: int, seed: int) -> GgufWeight:
    return GgufWeight(kquant_weights(n, K, kind, seed), kind, (n, K))


# a projection of each layout: a qkv-like table whose parts hold different types of one layout
TABLES = {"Q8": lambda: [random_weight("Q4_0", 40, K, 1), random_weight("Q8_0", 24, K, 2),
                         random_weight("Q4_1", 9, K, 3), q5_weight("Q5_0", 20, K, 9), q5_weight("Q5_1", 13, K, 10)],
          "Q8K": lambda: [kquant("Q4_K", 40, 4), kquant("Q6_K", 24, 5), kquant("Q5_K", 9, 6)]}


@pytest.mark.parametrize("layout", sorted(TABLES))
def test_the_team_quantized_x_gives_each_parts_lone_kernel_bits_at_1_to_33_rows(layout):
    parts = TABLES[layout]()
    n = sum(p.shape[0] for p in parts)
    segs, x = gguf_cpu.segments(parts, INT8_ALL), activations(33, K, seed=7)
    want = torch.cat([gguf_cpu.matmul(x, p, int8_rows=True) for p in parts], dim=1)  # each kernel quantizes x
    for t in at_threads(1, 2, 3):
        for m in range(1, 34):
            rows = gguf_cpu.team_counts()[0]
            got = gguf_cpu.linear(x[33 - m:], segs, K, n, None, STEP_DECODE)
            assert torch.equal(got, want[33 - m:]), (t, m)
            # shared from 2 rows on (each row once, whatever the thread count); a lone row quantizes its own
            assert gguf_cpu.team_counts()[0] - rows == (m if m >= 2 else 0), (t, m)


def test_a_prefill_pieces_tiles_take_their_panels_from_the_callers_work():
    parts = TABLES["Q8"]()
    n = sum(p.shape[0] for p in parts)
    segs, x = gguf_cpu.segments(parts), activations(20, K, seed=8)
    want = torch.cat([gguf_cpu.linear(x, gguf_cpu.segments([p]), K, p.shape[0], None, STEP_PREFILL) for p in parts],
                     dim=1)
    for t in at_threads(1, 2):
        own = gguf_cpu.team_counts()[1]
        assert torch.equal(gguf_cpu.linear(x, segs, K, n, None, STEP_PREFILL), want), t
        assert gguf_cpu.team_counts()[1] == own, t  # no tile call malloc'd its own panels

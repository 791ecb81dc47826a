"""The GGUF int8-activation kernels on VNNI (csrc/dot_u8s8.h: one vpdpbusd where an AVX2 build spends maddubs,
madd and add) give the very bits of the same sources built without it: the byte dot products are exact integers
either way. Each type's int8 kernel at the row counts of its passes (a lone row, the 4-row passes, the 8-row lanes
from 4 rows of x on, a chunk of 33) on the loaded build and on an AVX2-only build of the same sources. Skipped where
the loaded build has no VNNI (it then is the AVX2 build, which the other GGUF tests hold to the references)."""
from __future__ import annotations

import ctypes

import pytest
import torch

from npu_ops import cpu_kernels, gguf_cpu
from npu_ops.quant_gguf import GgufWeight
from tests.unit.test_gguf_kquant import weights as kquant_weights
from tests.unit.test_gguf_q5 import random_weight as q5_weight
from tests.unit.test_gguf_q8 import activations, random_weight

pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")
K = 512
ROWS = (1, 2, 3, 4, 5, 8, 16, 33)


@pytest.fixture(scope="module")
def avx2_lib() -> ctypes.CDLL:
    """The same sources built without AVX-512 and AVX-VNNI: the maddubs sums a CPU without VNNI runs."""
    if gguf_cpu.int8_core() != "vnni":
        pytest.skip("the loaded build already sums on maddubs")
    lib = cpu_kernels.build_variant(cpu_kernels.AVX2_ONLY)
    assert gguf_cpu.int8_core(lib) == "maddubs"
    return lib


def _weights() -> dict[str, GgufWeight]:
    out = {kind: random_weight(kind, 40, K, seed) for seed, kind in enumerate(("Q4_0", "Q4_1", "Q8_0"), 1)}
    out.update({kind: q5_weight(kind, 24, K, seed) for seed, kind in enumerate(("Q5_0", "Q5_1"), 4)})
    out.update({kind: GgufWeight(kquant_weights(24, K, kind, seed), kind, (24, K))
                for seed, kind in enumerate(("Q4_K", "Q5_K", "Q6_K"), 6)})
    return out


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"])
def test_vnni_int8_kernels_give_the_avx2_builds_bits(kind, avx2_lib):
    w = _weights()[kind]
    x = activations(max(ROWS), K, seed=11)
    x[0] *= 1e3  # a row whose int8 values reach +-127 in every block
    for m in ROWS:
        got = gguf_cpu.matmul(x[:m], w, int8_rows=True)
        want = gguf_cpu.matmul(x[:m], w, int8_rows=True, lib=avx2_lib)
        assert torch.equal(got, want), (kind, m)


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K"])
def test_vnni_kquant_kernels_at_odd_shapes(kind, avx2_lib):
    """27 weight rows (a short last group of 8; the lone-row passes' single rows after their groups of 4) and 3
    super-blocks a row: every K-quant pass's VNNI sums at the edges of its tiles."""
    n, k = 27, 768
    w = GgufWeight(kquant_weights(n, k, kind, 21), kind, (n, k))
    x = activations(9, k, seed=12)
    x[1] *= 1e3
    for m in (1, 2, 3, 4, 9):
        got = gguf_cpu.matmul(x[:m], w, int8_rows=True)
        assert torch.equal(got, gguf_cpu.matmul(x[:m], w, int8_rows=True, lib=avx2_lib)), (kind, m)

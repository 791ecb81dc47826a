"""The all-greedy sampler's C pass (npu_ops/csrc/elementwise.c greedy_rows_f32): the first argmax of each row and
its log-probability, held against torch on random odd shapes, ties and rows with NaN or infinite logits."""
from __future__ import annotations

import pytest
import torch

from npu_ops import cpu_kernels

pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")


# (1, 16389), (1, 49152): a lone row split over the threads, its tie across two threads' spans
@pytest.mark.parametrize("rows,vocab", [(1, 1), (1, 7), (3, 8), (5, 37), (33, 1000), (2, 49152), (40, 2049),
                                        (1, 16389), (1, 49152)])
def test_greedy_rows_match_torch(rows, vocab):
    g = torch.Generator().manual_seed(rows * vocab)
    x = torch.randn(rows, vocab, generator=g) * 4
    if vocab > 9:  # a tie: the first of the equal maxima wins, as torch.argmax picks it
        x[0, 9] = x[0, vocab - 1] = x[0].max() + 1
    got = cpu_kernels.greedy_rows(x)
    assert got is not None
    assert got[0] == x.argmax(-1).tolist()
    want = x.gather(1, x.argmax(-1)[:, None])[:, 0] - x.logsumexp(-1)
    torch.testing.assert_close(torch.tensor(got[1]), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("at", [0, 5, 22])  # in a vector lane and in the scalar tail
def test_greedy_rows_refuse_rows_that_are_not_finite(bad, at):
    x = torch.randn(3, 23)
    x[1, at] = bad
    assert cpu_kernels.greedy_rows(x) is None
    assert cpu_kernels.greedy_rows(x[[0, 2]]) is not None

"""The greedy argmax breaks every tie toward the first index, as torch.argmax does (npu_ops/greedy.py,
csrc/greedy_rows.c): ties between the 8 lanes of an AVX2 vector (the later index in an earlier lane), within
one lane across vectors, between the vectors and the scalar tail, and between the spans of a lone row split
over a team of threads. Held against PyTorch's reference (``logits.argmax``, ``logsumexp``) and a plain Python
first-index-of-the-maximum, on several rows at once and row lengths that are no multiple of 8."""
from __future__ import annotations

import random

import pytest
import torch

from npu_ops import cpu_kernels, greedy

needs_kernel = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")


def first_max(row: list[float]) -> int:
    return row.index(max(row))


def tie_rows(n: int) -> torch.Tensor:
    """Rows of length ``n``, each with two or three equal maxima placed to catch one way of getting ties wrong."""
    places = [
        (15, 17),  # vector 1 lane 7, vector 2 lane 1: the later index sits in the earlier lane
        (7, 9, 10),  # lane 7, then lanes 1 and 2 of the next vector
        (3, 11, 19),  # one lane (3) in three vectors
        (0, 8),  # the first element (each lane's starting maximum) and lane 0 of the next vector
        (6, n - 1),  # a lane and the last element (the scalar tail when n % 8)
        (n - 2, n - 1),  # the tail, or the last vector's lanes 6 and 7
        (1, n // 2 * 2 - 1, n - 3),
    ]
    g = torch.Generator().manual_seed(n)
    rows = []
    for idx in places:
        row = torch.randn(n, generator=g)
        for i in idx:
            if 0 <= i < n:
                row[i] = 5.0
        rows.append(row)
    return torch.stack(rows)


def integer_rows(rows: int, n: int, seed: int) -> torch.Tensor:
    """Logits drawn from a few integers: ties everywhere, in every lane, vector and tail."""
    rnd = random.Random(seed)
    return torch.tensor([[float(rnd.randint(0, 4)) for _ in range(n)] for _ in range(rows)])


def check(x: torch.Tensor) -> None:
    got = greedy.first_maxima(x)
    assert got is not None
    assert got[0] == x.argmax(-1).tolist() == [first_max(r) for r in x.tolist()]
    want = x.gather(1, x.argmax(-1)[:, None])[:, 0] - x.logsumexp(-1)
    torch.testing.assert_close(torch.tensor(got[1]), want, rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("n", [8, 9, 16, 17, 23, 24, 31, 100, 1001])
def test_placed_ties_go_to_the_first_index(n):
    check(tie_rows(n))


@needs_kernel
@pytest.mark.parametrize("rows,n", [(1, 13), (5, 64), (33, 250), (70, 1001)])  # 70 x 1001: rows over threads
def test_integer_logits_tie_everywhere(rows, n):
    check(integer_rows(rows, n, rows * n))


@needs_kernel
@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("n", [16384, 16389, 20007])
def test_a_lone_row_over_a_team_keeps_the_first_of_ties_across_spans(threads, n):
    """A lone row of at least 16,384 logits is cut into one span a thread; the maximum sits in every span."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(n + threads)
        x = torch.randn(1, n, generator=g)
        x[0, [n - 1, n // 2 + 1, n // 3 + 5, 2 * n // 3 + 2, 11]] = 9.0  # equal maxima in every span
        check(x)
        x[0, 11] = 0.0
        check(x)
        check(integer_rows(1, n, n))
    finally:
        torch.set_num_threads(before)


def test_the_portable_path_is_the_reference_too(monkeypatch):
    """Without the kernels (a device, no compiler) first_maxima takes torch's argmax: the same ties."""
    monkeypatch.setattr(cpu_kernels, "greedy_rows", lambda logits: None)
    check(tie_rows(23))
    check(integer_rows(9, 41, 3))

"""Rejection sampling of a sampled draft (engine.sample.spec_accept) keeps the target's distribution exactly: by
enumeration over every draft token of a tiny vocabulary (analytically, for many (p, q) pairs, supports that
overlap partly or not at all, one-hot drafts), and by Monte-Carlo draws through verify_draft itself."""
from __future__ import annotations

import torch
from scipy.stats import chisquare

from mindie_service.engine.sample.spec_accept import acceptance, output_distribution, residual, verify_draft

VOCAB = 6


def _dist(g: torch.Generator, zero: int = 0) -> torch.Tensor:
    """A random distribution over VOCAB with ``zero`` tokens of no mass (top-k/top-p cuts)."""
    x = torch.rand(VOCAB, generator=g, dtype=torch.float64) ** 3
    x[torch.randperm(VOCAB, generator=g)[:zero]] = 0.0
    return x / x.sum()


def _pairs() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    pairs = [(_dist(g, zp), _dist(g, zq)) for zp in (0, 2, 4) for zq in (0, 3, 5) for _ in range(6)]
    disjoint_p, disjoint_q = torch.zeros(VOCAB, dtype=torch.float64), torch.zeros(VOCAB, dtype=torch.float64)
    disjoint_p[:3], disjoint_q[3:] = 1 / 3, 1 / 3
    one_hot = torch.zeros(VOCAB, dtype=torch.float64)
    one_hot[2] = 1.0
    same = _dist(g)
    return pairs + [(disjoint_p, disjoint_q), (_dist(g), one_hot), (same, same.clone())]


def test_enumeration_gives_the_target_distribution_exactly():
    for p, q in _pairs():
        assert torch.allclose(output_distribution(p, q), p, atol=1e-12), (p, q)


def test_acceptance_and_residual_follow_the_paper():
    for p, q in _pairs():
        total_accept = sum(float(q[d]) * acceptance(p, q, d) for d in range(VOCAB))
        assert abs(total_accept - float(torch.minimum(p, q).sum())) < 1e-12  # E[accept] = sum min(p, q)
        r = residual(p, q)
        assert abs(float(r.sum()) - 1.0) < 1e-12
        for d in range(VOCAB):
            if acceptance(p, q, d) < 1.0 and q[d] > 0:
                assert r[d] == 0.0  # a rejected token never equals the draft it rejected


def test_monte_carlo_draws_follow_the_target():
    """8,000 (draft ~ q, verify) draws per pair: token counts against p, chi-square at 0.1%; rejected
    drafts are never re-emitted."""
    g = torch.Generator().manual_seed(1234)
    gen = torch.Generator().manual_seed(99)
    for p, q in _pairs()[4::12] + _pairs()[-3:]:
        n = 8_000
        counts = torch.zeros(VOCAB)
        for d in torch.multinomial(q, n, replacement=True, generator=g).tolist():
            x = verify_draft(p, q, d, gen)
            if x != d:
                assert acceptance(p, q, d) < 1.0
            counts[x] += 1
        keep = p > 0
        assert counts[~keep].sum() == 0
        assert chisquare(counts[keep].numpy(), (p[keep] * n).numpy()).pvalue > 0.001, (p, q, counts)


def test_one_hot_or_unknown_q_draws_from_the_target_and_is_seeded():
    p = _dist(torch.Generator().manual_seed(3))
    a = [verify_draft(p, None, 1, torch.Generator().manual_seed(s)) for s in range(50)]
    b = [int(torch.multinomial(p, 1, generator=torch.Generator().manual_seed(s))[0]) for s in range(50)]
    assert a == b  # draw-and-compare: the very draw the sampler makes without speculation
    q = _dist(torch.Generator().manual_seed(4))
    c = [verify_draft(p, q, 2, torch.Generator().manual_seed(s)) for s in range(50)]
    assert c == [verify_draft(p, q, 2, torch.Generator().manual_seed(s)) for s in range(50)]

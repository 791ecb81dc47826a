"""Rejection sampling of a sampled draft (Leviathan et al., 2023, "Fast Inference from Transformers via
Speculative Decoding", algorithm 1).

A draft model that samples its draft ``d`` from its own distribution ``q`` (the request's temperature, top-k,
top-p and typical-p over the draft's logits) is verified against the target's processed distribution ``p``
at the same position: ``d`` is accepted with probability ``min(1, p(d) / q(d))``; on rejection the token is
drawn from the residual ``max(0, p - q)`` normalised. Whatever ``q`` is, the emitted token is distributed as
``p`` exactly: ``q(x) min(1, p(x)/q(x)) + P(reject) * residual(x) = min(q, p)(x) + max(0, p - q)(x) = p(x)``.
A rejected token never equals ``d`` (rejection needs ``p(d) < q(d)``, where the residual is 0), so the
verify's run logic (engine.spec.speculator: a run goes on while the drawn token equals the next draft) holds.
When every draft is accepted the row after the last draft draws its bonus token from ``p`` as usual.

One-hot drafts (n-gram continuations, a greedy request's draft argmax, or a draft whose ``q`` is unknown)
keep the draw-and-compare rule: ``x ~ p``, accepted iff ``x == d``, which is the same rule for ``q = δ_d``.
Draws come from the request's own generator (engine.sample.sampler): deterministic per seed."""
from __future__ import annotations

import logging
from typing import Any, Protocol

import torch

logger = logging.getLogger(__name__)


class DraftDists(Protocol):
    def dists_for(self, request_id: str, drafts: tuple[int, ...]) -> torch.Tensor | None:
        """The draft's distributions q (one row per draft of ``drafts``), None when the drafts were one-hot."""


def acceptance(p: torch.Tensor, q: torch.Tensor, draft: int) -> float:
    """The probability that the verify keeps ``draft`` (drawn from ``q``): min(1, p(d) / q(d))."""
    qd = float(q[draft])
    if qd <= 0.0:
        return 0.0  # never drawn from q: verify_draft treats such a draft as one-hot instead
    return min(1.0, float(p[draft]) / qd)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The distribution a rejection draws from: max(0, p - q) normalised (``p`` when that has no mass, which
    rejection cannot reach unless rounding put it there)."""
    r = (p - q).clamp(min=0.0)
    total = float(r.sum())
    return r / total if total > 0.0 else p


def verify_draft(p: torch.Tensor, q: torch.Tensor | None, draft: int, g: torch.Generator) -> int:
    """The target's token at a row that checks ``draft``: ``draft`` itself when accepted, else a token that
    differs from it. ``p``, ``q``: probabilities over the vocabulary (float64); ``q`` None: one-hot draft."""
    if q is None or float(q[draft]) <= 0.0:
        return int(torch.multinomial(p, 1, generator=g)[0])
    u = float(torch.rand((), generator=g, dtype=torch.float64))
    if u < acceptance(p, q, draft):
        return draft
    return int(torch.multinomial(residual(p, q), 1, generator=g)[0])


def output_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The exact distribution of verify_draft's token when the draft is drawn from ``q`` (enumerating every
    draft): sum over d of q(d) (acceptance * δ_d + (1 - acceptance) * residual)."""
    out = torch.zeros_like(p)
    res = residual(p, q)
    for d in range(p.shape[0]):
        qd = float(q[d])
        if qd <= 0.0:
            continue
        a = acceptance(p, q, d)
        out[d] += qd * a
        out += qd * (1.0 - a) * res
    return out


def row_dists(chunks: list[Any], proposer: DraftDists | None) -> list[torch.Tensor | None] | None:
    """Per sampler row of a verify step (engine.spec.speculator.verify_rows' order), the draft distribution its
    draft was drawn from (None: one-hot, or the row ends its run); None when no row has one."""
    if proposer is None:
        return None
    out: list[torch.Tensor | None] = []
    for c in chunks:
        qs = proposer.dists_for(c.request_id, tuple(c.token_ids[1:])) if c.num_draft else None
        if qs is None:
            out.extend([None] * (c.num_draft + 1))
        else:
            out.extend([qs[j] for j in range(c.num_draft)] + [None])
    return out if any(q is not None for q in out) else None

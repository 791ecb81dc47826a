"""When speculation pays, and how far (engine.spec.speculator). Plain Python.

A step that computes T tokens costs about ``a + b*T`` seconds: ``a`` is reading the weights (one pass
whatever the batch), ``b`` the work per token. Both are fitted from the engine's measured decode step times
(least squares, old steps forgotten geometrically, one fit per batch-size class), never a constant. A plain decode step of B rows
makes B tokens in ``t(B)``; the i-th draft token of a row adds ``b`` (plus, for a draft model, its share
of one measured draft forward) and brings, in expectation, ``r**i`` tokens, ``r`` being the row's measured
acceptance rate per draft token. It pays while ``r**i > c``, ``c = (b + draft_cost) * B / t(B)``: one rule
gives both the per-sequence depth (down to 0: a row whose drafts keep failing stops drafting, and probes
with one draft now and then to notice when they would succeed again) and the per-step cut-off (with a
large batch ``c`` nears 1 and nothing is drafted). Until the fit has seen steps of different sizes the
rule trusts a prior that lets speculation start, so it can be measured."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

PRIOR_COST = 0.05  # c before the step-time fit is usable: speculate, and measure
PRIOR_RATE, PRIOR_WEIGHT = 0.5, 2.0  # a new row's acceptance rate: a prior worth two draft tokens
DECAY = 0.9  # per verify: the weight old acceptance observations keep
FORGET = 0.98  # per step: the weight old step-time observations keep
PROBE_EVERY = 16  # steps a row drafting nothing waits before one probing draft
MIN_SPREAD = 1.0  # tokens (standard deviation): a class's fit is refreshed while its step sizes vary this much


@dataclass
class SeqSpec:
    """One sequence's speculation state: its acceptance record and its proposer's state."""

    accepted: float = 0.0
    tried: float = 0.0
    idle_steps: int = 0
    index: Any = None  # the n-gram proposer's NgramIndex
    shadow: Any = None  # the draft model's copy of the sequence (its own blocks)

    @property
    def rate(self) -> float:
        return (self.accepted + PRIOR_RATE * PRIOR_WEIGHT) / (self.tried + PRIOR_WEIGHT)

    def record(self, proposed: int, accepted: int) -> None:
        """A verify of ``proposed`` drafts kept ``accepted``: that many successes, then one failure if short."""
        self.accepted = self.accepted * DECAY + accepted
        self.tried = self.tried * DECAY + accepted + (1 if accepted < proposed else 0)


@dataclass
class LineFit:
    """Weighted least squares of step seconds on step tokens, old steps forgotten geometrically."""

    n: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    last: tuple[float, float] | None = None  # the latest usable (a, b): kept while the sizes stop varying

    def observe(self, tokens: int, seconds: float) -> None:
        f = FORGET
        self.n, self.sx, self.sy = self.n * f + 1, self.sx * f + tokens, self.sy * f + seconds
        self.sxx, self.sxy = self.sxx * f + tokens * tokens, self.sxy * f + tokens * seconds

    def fit(self) -> tuple[float, float] | None:
        """(a, b) from the recent steps, else the last usable fit, else None (never measured)."""
        if self.n >= 3:
            var = self.sxx / self.n - (self.sx / self.n) ** 2
            if var >= MIN_SPREAD ** 2:
                b = max(0.0, (self.sxy / self.n - self.sx * self.sy / self.n ** 2) / var)
                self.last = (max(1e-6, self.sy / self.n - b * self.sx / self.n), b)
        return self.last


def size_class(rows: int) -> int:
    """The batch-size class of a step of ``rows`` decoding rows: 1, 2-3, 4-7, 8-15, ... (log2)."""
    return max(1, rows).bit_length() - 1


@dataclass
class StepCostModel:
    """Step seconds as ``a + b*T`` (T: the step's tokens), fitted per batch-size class of decoding rows: a
    CPU's step is bandwidth-bound at one row and compute-bound at many, so one line over all sizes would
    price a one-stream draft with the big batches' slope. Only steps of decoding rows (plus their drafts)
    are fitted: a step that also prefills a prompt is left out (``expect`` / ``observe``)."""

    fits: dict[int, LineFit] = field(default_factory=dict)
    draft_s: float = 0.0  # a draft forward's seconds per row (EMA; 0 for the n-gram proposer)
    expected: tuple[int, int] | None = None  # (decoding rows, most tokens) of the step being scheduled

    def expect(self, rows: int, max_tokens: int) -> None:
        """The coming step has ``rows`` decoding rows and, with its drafts, at most ``max_tokens`` tokens."""
        self.expected = (rows, max_tokens) if rows > 0 else None

    def observe(self, tokens: int, seconds: float) -> None:
        """A step's measured time: fitted when it was the expected decode step (no prompt tokens in it)."""
        exp, self.expected = self.expected, None
        if exp is not None and exp[0] <= tokens <= exp[1]:
            self.fits.setdefault(size_class(exp[0]), LineFit()).observe(tokens, seconds)

    def observe_draft(self, rows: int, seconds: float) -> None:
        if rows > 0:
            per_row = seconds / rows
            self.draft_s = per_row if self.draft_s == 0.0 else 0.8 * self.draft_s + 0.2 * per_row

    def fit(self, rows: int) -> tuple[float, float] | None:
        f = self.fits.get(size_class(rows))
        return f.fit() if f is not None else None

    def cost(self, rows: int) -> float:
        """``c`` for a step of ``rows`` decoding rows (see the module docstring)."""
        ab = self.fit(rows)
        if ab is None:
            return PRIOR_COST
        a, b = ab
        return (b + self.draft_s) * rows / (a + b * rows)


def probe_interval(c: float) -> int:
    """Steps between a non-drafting row's probes: PROBE_EVERY where a draft is nearly free, rarer as its cost
    ``c`` nears a plain token's (a probe of a large batch's row costs almost what a token brings)."""
    return math.ceil(PROBE_EVERY / max(1e-3, 1.0 - c))


def depth(state: SeqSpec, k_max: int, c: float, dynamic: bool) -> int:
    """How many drafts this row proposes this step."""
    if not dynamic:
        return k_max
    if c >= 1.0:
        return 0
    r, k = state.rate, 0
    while k < k_max and r ** (k + 1) > c:
        k += 1
    if k == 0:
        state.idle_steps += 1
        if state.idle_steps >= probe_interval(c):  # one draft now and then, so the rate can recover
            state.idle_steps = 0
            return 1
        return 0
    state.idle_steps = 0
    return k


@dataclass
class SpecCounters:
    """Totals since start (metrics: vllm:spec_decode_num_drafts, _num_draft_tokens, _num_accepted_tokens)."""

    num_drafts: int = 0  # verify rows that carried drafts
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def record(self, proposed: int, accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += proposed
        self.num_accepted_tokens += accepted
        while len(self.accepted_per_position) < proposed:
            self.accepted_per_position.append(0)
        for i in range(accepted):
            self.accepted_per_position[i] += 1

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a verify row yields on average: its accepted drafts plus the target's own token."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    def stats_fields(self) -> dict[str, int | float]:
        """EngineStats' speculative-decoding fields."""
        return {"spec_num_drafts": self.num_drafts, "spec_num_draft_tokens": self.num_draft_tokens,
                "spec_num_accepted_tokens": self.num_accepted_tokens,
                "spec_mean_accepted_length": self.mean_accepted_length}

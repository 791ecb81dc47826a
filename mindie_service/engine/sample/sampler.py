"""Turn last-position logits into tokens, vectorised over the batch.

Order: repetition penalty (HF: over prompt and output), frequency penalty (output only), then
greedy argmax, or temperature -> top-k -> top-p -> typical-p and a draw from each request's own
seeded generator, so a seeded request gives the same tokens whatever else is in the batch.
Logprobs are reported from the model's raw distribution, floored at -9999.0 (OpenAI's value for
"impossible") so that JSON never sees -inf.

Robust by construction: penalties and warps run in float64 (a tiny temperature or penalty cannot
overflow), every row is checked before any generator draws, and a row whose logits or probabilities
are not finite raises NonFiniteRows naming its requests. The generators of the batch are restored if
sampling fails half way, so a re-run cannot have advanced a seeded neighbour."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from mindie_service.engine.sequence import Sequence
from mindie_service.engine.sample.spec_accept import verify_draft
from npu_ops.greedy import first_maxima


LOGPROB_FLOOR = -9999.0


class NonFiniteRows(RuntimeError):
    """Rows whose logits (or probabilities after penalties and warps) are NaN or infinite."""

    def __init__(self, request_ids: list[str]) -> None:
        super().__init__(f"non-finite logits for {', '.join(request_ids)}")
        self.request_ids = request_ids


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]]  # per row: the top-n (id, logprob) alternatives, n = params.logprobs


class Sampler:
    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def _restore(self, snapshot: dict[str, torch.Tensor], request_ids: list[str]) -> None:
        """Put back the generators of ``request_ids`` as they were before a failed draw."""
        for rid in request_ids:
            state = snapshot.get(rid)
            if state is None:
                self._generators.pop(rid, None)  # created during the failed draw: start afresh
            else:
                self._generators[rid].set_state(state)

    def _generator(self, seq: Sequence, device: torch.device) -> torch.Generator:
        g = self._generators.get(seq.request_id)
        if g is None:
            g = torch.Generator(device=device)
            g.manual_seed(seq.seed % (2**63))  # torch seeds are signed 64-bit
            self._generators[seq.request_id] = g
        return g

    @staticmethod
    def _penalise(x: torch.Tensor, seqs: list[Sequence]) -> bool:
        """Apply each row's penalties and biases in place; whether any row had one."""
        changed = False
        for r, seq in enumerate(seqs):
            p = seq.params
            if (p.repetition_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0
                    and not p.logit_bias):
                continue
            changed = True
            if p.repetition_penalty != 1.0:
                ids = torch.tensor(seq.token_ids(), device=x.device).unique()
                g = x[r, ids]
                x[r, ids] = torch.where(g > 0, g / p.repetition_penalty, g * p.repetition_penalty)
            if p.frequency_penalty != 0.0 and seq.output_token_ids:
                counts = torch.bincount(torch.tensor(seq.output_token_ids, device=x.device), minlength=x.shape[1])
                x[r] -= p.frequency_penalty * counts[: x.shape[1]].to(x.dtype)
            if p.presence_penalty != 0.0 and seq.output_token_ids:
                seen = torch.tensor(seq.output_token_ids, device=x.device).unique()
                x[r, seen[seen < x.shape[1]]] -= p.presence_penalty
            if p.logit_bias:
                ids = torch.tensor(list(p.logit_bias), device=x.device)
                keep = ids < x.shape[1]
                x[r, ids[keep]] += torch.tensor(list(p.logit_bias.values()), device=x.device, dtype=x.dtype)[keep]
        return changed

    @staticmethod
    def _warp(x: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Temperature, top-k, top-p, min-p, typical-p on the sampling rows; returns probabilities."""
        dev = x.device
        temp = torch.tensor([s.params.temperature for s in seqs], device=dev, dtype=x.dtype)
        x = x / temp[:, None]
        vocab = x.shape[1]
        ks = [s.params.top_k if 0 < s.params.top_k < vocab else vocab for s in seqs]
        if min(ks) < vocab:
            k = torch.tensor(ks, device=dev)
            kth = torch.sort(x, dim=-1, descending=True).values.gather(1, (k - 1)[:, None])
            x = x.masked_fill(x < kth, float("-inf"))
        top_p = torch.tensor([s.params.top_p for s in seqs], device=dev, dtype=x.dtype)
        if (top_p < 1.0).any():
            sorted_x, order = torch.sort(x, dim=-1, descending=False)
            cum = sorted_x.softmax(-1).cumsum(-1)
            drop = cum <= (1 - top_p)[:, None]
            drop[:, -1] = False  # always keep the most likely token
            x = x.masked_fill(drop.scatter(1, order, drop), float("-inf"))
        min_p = torch.tensor([s.params.min_p for s in seqs], device=dev, dtype=x.dtype)
        if (min_p > 0.0).any():  # vLLM's and HF's MinPLogitsWarper: relative to the most likely token
            probs = x.softmax(-1)
            x = x.masked_fill(probs < min_p[:, None] * probs.max(-1, keepdim=True).values, float("-inf"))
        typical = torch.tensor([s.params.typical_p for s in seqs], device=dev, dtype=x.dtype)
        if (typical < 1.0).any():
            logp = x.log_softmax(-1)
            p = logp.exp()
            ent = -(torch.nan_to_num(logp * p)).sum(-1, keepdim=True)
            shifted = (-logp - ent).abs()
            sorted_s, order = torch.sort(shifted, dim=-1)
            cum = x.gather(1, order).softmax(-1).cumsum(-1)
            last = (cum < typical[:, None]).sum(1).clamp(max=x.shape[1] - 1)
            drop_sorted = sorted_s > sorted_s.gather(1, last[:, None])
            drop = drop_sorted.scatter(1, order, drop_sorted) & (typical < 1.0)[:, None]
            x = x.masked_fill(drop, float("-inf"))
        return x.softmax(-1)

    @staticmethod
    def _greedy_only(logits: torch.Tensor, seqs: list[Sequence]) -> SampleResult | None:
        """Every row greedy with no penalty, bias or top-n logprobs, and every logit finite (the usual batch):
        the argmax and the chosen token's log-probability (logit - logsumexp), without the full log-softmax
        and float64 copy of the vocabulary. None where the general path must run."""
        for s in seqs:
            p = s.params
            if (not p.greedy or p.logprobs or p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0
                    or p.presence_penalty != 0.0 or p.logit_bias):
                return None
        got = first_maxima(logits)
        if got is None:
            return None  # the general path names the bad rows
        return SampleResult(got[0], [max(v, LOGPROB_FLOOR) for v in got[1]], [[] for _ in seqs])

    def _draw(self, probs: torch.Tensor, seqs: list[Sequence], sample_rows: list[int], chosen: torch.Tensor,
              drafts: list[int | None] | None, draft_probs: list[torch.Tensor | None] | None) -> None:
        """Each sampling row's draw into ``chosen``, in order; a request's rows stop after a rejected draft."""
        stopped: set[str] = set()  # requests whose run ended at a rejected draft
        for j, r in enumerate(sample_rows):
            rid = seqs[r].request_id
            if rid in stopped:
                continue
            g = self._generator(seqs[r], probs.device)
            d = drafts[r] if drafts is not None else None
            q = draft_probs[r] if draft_probs is not None and d is not None else None
            if q is not None and d is not None:
                chosen[r] = verify_draft(probs[j], q.to(probs.device, probs.dtype), d, g)
            else:
                chosen[r] = torch.multinomial(probs[j], 1, generator=g)[0]
            if d is not None and int(chosen[r]) != d:
                stopped.add(rid)

    def sample(self, logits: torch.Tensor, seqs: list[Sequence],
               drafts: list[int | None] | None = None,
               draft_probs: list[torch.Tensor | None] | None = None) -> SampleResult:
        """One token per row. ``drafts`` (speculative decoding, engine.spec.speculator): rows of one request
        are consecutive verify positions; row r's token is checked against ``drafts[r]`` and once one
        differs the request's later rows are not drawn (their generator is not advanced): every emitted
        token costs the generator one draw, in order, as without speculation. ``draft_probs[r]``: the
        distribution a sampled draft model drew ``drafts[r]`` from; that row rejection-samples against it
        (engine.sample.spec_accept: an accept draw, then a residual draw on rejection)."""
        fast = self._greedy_only(logits, seqs)  # greedy rows ignore drafts: their token is the argmax
        if fast is not None:
            return fast
        # A row with a NaN, a +inf, or nothing above -inf has no distribution to sample. One check of the
        # whole step first: the per-row checks run only when something is not finite (rare).
        # (A row's max is NaN, +inf or -inf exactly when the row is bad: one pass, and a grammar's -inf entries,
        # present in every constrained step, no longer send the step to the per-row checks.)
        row_ok = logits.amax(-1).isfinite()
        bad = None if bool(row_ok.all()) else ~row_ok
        raw_logprobs = logits.log_softmax(-1)
        x = logits.double()  # float64: a penalty or temperature near float32's limits cannot overflow
        if self._penalise(x, seqs) and not bool(x.isfinite().all()):
            bad = _bad_rows(x) if bad is None else bad | _bad_rows(x)
        chosen = x.argmax(-1)
        sample_rows = [r for r, s in enumerate(seqs) if not s.params.greedy]
        probs = None
        if sample_rows:
            rows = torch.tensor(sample_rows, device=x.device)
            probs = self._warp(x[rows], [seqs[r] for r in sample_rows])
            row_ok = probs.isfinite().all(-1) & (probs.sum(-1) > 0)
            if not bool(row_ok.all()):
                bad = torch.zeros(len(seqs), dtype=torch.bool, device=x.device) if bad is None else bad
                bad[rows] |= ~row_ok
        if bad is not None and bool(bad.any()):  # checked before any generator draws: the neighbours' streams are untouched
            raise NonFiniteRows([seqs[r].request_id for r in bad.nonzero()[:, 0].tolist()])
        if sample_rows:
            assert probs is not None
            snapshot = {seqs[r].request_id: g.get_state() for r in sample_rows
                        if (g := self._generators.get(seqs[r].request_id)) is not None}
            try:
                self._draw(probs, seqs, sample_rows, chosen, drafts, draft_probs)
            except BaseException:
                self._restore(snapshot, [seqs[r].request_id for r in sample_rows])
                raise
        raw_logprobs = raw_logprobs.clamp(min=LOGPROB_FLOOR)
        chosen_lp = raw_logprobs.gather(1, chosen[:, None])[:, 0]
        tops: list[list[tuple[int, float]]] = [[] for _ in seqs]
        n_top = max((s.params.logprobs or 0) for s in seqs)
        if n_top:
            vals, idx = raw_logprobs.topk(n_top, dim=-1)
            vals_l, idx_l = vals.tolist(), idx.tolist()
            for r, s in enumerate(seqs):
                n = s.params.logprobs or 0
                tops[r] = list(zip(idx_l[r][:n], vals_l[r][:n]))
        return SampleResult(chosen.tolist(), chosen_lp.tolist(), tops)


def _bad_rows(t: torch.Tensor) -> torch.Tensor:
    """Rows holding a NaN or a +inf, or nothing finite."""
    return t.isnan().any(-1) | t.isposinf().any(-1) | ~t.isfinite().any(-1)

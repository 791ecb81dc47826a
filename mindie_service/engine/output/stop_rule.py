"""The one stop rule: whether a sequence stops at the token it just got, and why.

Every path that appends tokens asks it through the output processor (``OutputProcessor.token``): a sampled
token, each token of a multi-step burst (engine.sched.bursts) and of an accepted speculative run
(engine.spec.speculator), a token a grammar forces (engine.sample.grammar_masks), and a finished beam search's
chosen beam (engine.sample.beam). The engine cuts a run at the first token the rule stops, and
``Scheduler.update`` frees the sequences it stopped. A grammar's end is its EOS (the grammar allows nothing
else), so it stops by the EOS clause; beam search ranks with ``length_reached`` as its hypotheses' cap.
``min_tokens`` has two halves: nothing but the cap stops before it, and ``ban_early_stops`` keeps EOS and the
stop token ids from being drawn meanwhile (transformers' min_new_tokens)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from mindie_service.engine.contract import FINISH_EOS, FINISH_LENGTH, FINISH_STOP
from mindie_service.sampling_params import SamplingParams


@dataclass(frozen=True)
class StopCheck:
    """One token's facts, as the output processor has them after detokenizing it."""

    token_id: int
    num_output: int  # output tokens with this one
    max_output: int  # min(max_tokens, maxIterTimes, maxSeqLen - prompt)
    stop_string_hit: bool  # the detokenizer found a stop string in the text so far
    min_tokens: int = 0  # before this many output tokens only the cap stops (vLLM's min_tokens)


def length_reached(num_output: int, max_output: int) -> bool:
    return num_output >= max_output


def stop_reason(c: StopCheck, eos_token_ids: frozenset[int], ignore_eos: bool,
                stop_token_ids: frozenset[int] | tuple[int, ...] = ()) -> str | None:
    """``FINISH_EOS``, ``FINISH_STOP`` (a stop token id or stop string), ``FINISH_LENGTH`` or None (go on). EOS
    wins over a stop string found by the same token, and either over the cap."""
    if c.num_output < c.min_tokens:  # EOS and stop ids were masked (ban_early_stops); stop strings wait too
        return FINISH_LENGTH if length_reached(c.num_output, c.max_output) else None
    if c.token_id in eos_token_ids and not ignore_eos:
        return FINISH_EOS
    if c.token_id in stop_token_ids or c.stop_string_hit:
        return FINISH_STOP
    if length_reached(c.num_output, c.max_output):
        return FINISH_LENGTH
    return None


class _Row(Protocol):  # what ban_early_stops reads of a row (a Sequence, or a verify row past the first)
    params: SamplingParams
    output_token_ids: list[int]


def ban_early_stops(logits: torch.Tensor, rows: Sequence[_Row], eos_token_ids: frozenset[int]) -> torch.Tensor:
    """``logits`` with EOS (unless ignored) and the stop token ids at -inf in the rows still short of their
    ``min_tokens`` (a verify row counts the drafts before it): the rule's other half, applied before sampling."""
    short = [(r, row.params) for r, row in enumerate(rows)
             if row.params.min_tokens and len(row.output_token_ids) < row.params.min_tokens]
    if not short:
        return logits
    logits = logits.clone()
    vocab = logits.shape[-1]
    for r, p in short:
        banned = [t for t in (*(() if p.ignore_eos else eos_token_ids), *p.stop_token_ids) if t < vocab]
        logits[r, banned] = float("-inf")
    return logits

"""Speculative decoding: propose, verify in the step's one forward, accept exactly, roll back.

    spec.propose(running)          before scheduling: each decoding row's drafts (seq.draft_token_ids)
    scheduler.schedule()           keeps what its token budget, the output cap and free blocks allow; a row
                                   with drafts is one chunk (last token + drafts)
    runner.execute(out)            logits at every position of that chunk (1 + num_draft rows)
    sampler.sample(rows, drafts)   every row drawn as without speculation, in order, stopping a run at
                                   its first draw that differs from the draft it checks
    spec.accept(chunk, tokens)     the accepted run: the drafts the target agreed with, plus its own token
    scheduler.update(...)          run appended, rejected slots trimmed (never registered in the prefix cache)

Exactness. N-gram drafts, and a greedy request's draft-model drafts (its argmax), are one-hot. For a
one-hot draft ``d`` rejection sampling (Leviathan et al., 2023) accepts with probability ``p(d)`` and on
rejection draws from ``p`` without ``d``; drawing ``x ~ p`` and accepting iff ``x == d`` is that very
rule (``x`` is then the correction token). Each position is drawn from the target's processed
distribution (penalties over the accepted tokens before it, temperature, top-k/p, typical) with the
request's own generator, one draw per emitted token, in order: greedy output is token-identical to
decoding without speculation and a seeded n-gram request draws what it would have drawn without it.
A sampled request's draft-model drafts are drawn from the draft's own distribution ``q`` and accepted with
probability ``min(1, p/q)``, a rejection drawing from ``max(0, p - q)`` (engine.sample.spec_accept): the output
distribution is exactly the target's, and a seed repeats the same tokens (not the unspeculated ones).
Logprobs are the target's, row by row. EOS, a stop string or the output cap inside a run cut it there
(the output processor sees the run's tokens one at a time).

Structured output. A constrained row speculates too: its drafts are cut at the first token its grammar does
not allow (``Matcher.validate``, no state change), and each verify row is masked with the grammar's state
after the drafts before it (engine.sample.grammar_masks: the matcher advanced through them and rolled back, one
native call for the batch), so every draw is the one unspeculated constrained decoding makes there; the
accepted run is then consumed as the step's tokens (rejected drafts never reach the matcher). Where the grammar
forces the next bytes, their tokens are the row's drafts (no proposer asked): with forced runs off (a request
with logprobs) that is how its forced text still moves several tokens a step, logprobs exact."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from mindie_service.engine.sequence import Sequence
from mindie_service.engine.configs.spec_config import DRAFT_MODEL, SpeculativeConfig
from mindie_service.engine.spec.spec_ngram import NgramIndex, NgramProposer
from mindie_service.engine.spec.spec_policy import SeqSpec, SpecCounters, StepCostModel, depth
from mindie_service.engine.step import ScheduledChunk
from mindie_service.engine.sched.chunks import prefilling
from mindie_service.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from mindie_service.engine.configs.engine_config import EngineConfig
    from mindie_service.engine.spec.spec_draft import DraftModelProposer

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class DraftRow:
    """The sampler's view of a verify row past the first: the sequence with the drafts before this row taken
    as its output (penalties see them; the generator is the request's own)."""

    request_id: str
    params: SamplingParams
    seed: int
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    parent: Sequence | None = None  # the Sequence whose drafts this row checks (its grammar masks this row)
    depth: int = 0  # the drafts before this row: output_token_ids ends with that many of them

    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids


def verify_rows(chunks: list[ScheduledChunk], seqs: list[Sequence]) -> tuple[list[Sequence | DraftRow], list[int | None] | None]:
    """The sampler's rows of a step (one per logits row) and, when any chunk verifies drafts, the draft
    each row's draw is checked against (None: the row ends its run)."""
    if not any(c.num_draft for c in chunks):
        return list(seqs), None
    rows: list[Sequence | DraftRow] = []
    drafts: list[int | None] = []
    for c, seq in zip(chunks, seqs):
        rows.append(seq)
        if not c.num_draft:
            drafts.append(None)
            continue
        d = list(c.token_ids[1:])
        drafts.append(d[0])
        for j in range(1, len(d) + 1):
            rows.append(DraftRow(seq.request_id, seq.params, seq.seed, seq.prompt_token_ids,
                                 seq.output_token_ids + d[:j], seq, j))
            drafts.append(d[j] if j < len(d) else None)
    return rows, drafts


def accepted_run(chunk: ScheduledChunk, tokens: list[int]) -> list[int]:
    """The target's tokens of a verify chunk's rows -> the run it emits: while a row's token equals the next
    draft that draft is accepted and the following row's token counts too."""
    run = [tokens[0]]
    for j in range(1, 1 + chunk.num_draft):
        if tokens[j - 1] != chunk.token_ids[j]:
            break
        run.append(tokens[j])
    return run


class Speculator:
    def __init__(self, cfg: SpeculativeConfig, draft: DraftModelProposer | None = None) -> None:
        self.cfg = cfg
        self.ngram = NgramProposer(cfg.prompt_lookup_min, cfg.prompt_lookup_max, cfg.memory)
        self.draft = draft  # a DraftModelProposer (engine.spec.spec_draft) for method draft_model
        self.costs = StepCostModel()
        self.counters = SpecCounters()
        self.last_cost = 0.0
        self.grammar_cut = 0  # draft tokens cut before verifying because the row's grammar forbids them
        self.forced_drafts = 0  # draft tokens taken from the grammar's forced bytes

    def propose(self, running: list[Sequence], clock: Callable[[], float] = time.perf_counter) -> None:
        """Set each decoding row's drafts for this step (empty for rows that do not speculate); ``clock`` times the
        draft model's share (the engine's step clock, so that the cost model's two inputs share one clock)."""
        rows = [s for s in running if _eligible(s)]
        for s in running:
            s.draft_token_ids = []
        self.costs.expect(len(rows), len(rows))  # raised below by the drafts: a step with prompt tokens is not fitted
        if not rows:
            return
        c = self.costs.cost(len(rows))
        self.last_cost = c
        wants: list[tuple[Sequence, int]] = []
        for s in rows:
            if s.spec is None:
                s.spec = SeqSpec()
            k = min(depth(s.spec, self.cfg.num_speculative_tokens, c, self.cfg.dynamic),
                    s.max_output - len(s.output_token_ids) - 1)
            if k > 0:
                wants.append((s, k))
        wants = [(s, k) for s, k in wants if not self._grammar_drafts(s, k)]
        if wants and self.cfg.method == DRAFT_MODEL:
            t0 = clock()
            got = self.draft.propose(wants, {s.request_id for s in running})
            self.costs.observe_draft(len(wants), (clock() - t0) / max(1, max(k for _, k in wants)))
            for s, _ in wants:
                s.draft_token_ids = self._allowed(s, got.get(s.request_id, []))
        else:
            for s, k in wants:
                if s.spec.index is None:
                    s.spec.index = NgramIndex(self.cfg.prompt_lookup_min, self.cfg.prompt_lookup_max)
                s.draft_token_ids = self._allowed(s, self.ngram.propose(s.token_ids(), s.spec.index, k, s.cache_key))
        self.costs.expect(len(rows), len(rows) + sum(len(s.draft_token_ids) for s in rows))

    def _grammar_drafts(self, seq: Sequence, k: int) -> bool:
        """A constrained row whose grammar forces bytes next drafts their tokens (nearly always accepted: free
        drafts; with forced runs off, as for a request asking for logprobs, the only way its forced text goes
        faster than a token a step). True when it did (the proposer is then not asked)."""
        if seq.grammar is None:
            return False
        drafts = self._allowed(seq, seq.grammar.matcher.forced_tokens()[:k])
        if not drafts:
            return False
        seq.draft_token_ids = drafts
        self.forced_drafts += len(drafts)
        return True

    def _allowed(self, seq: Sequence, drafts: list[int]) -> list[int]:
        """``drafts`` cut at the first token ``seq``'s grammar does not allow after the ones before it."""
        if seq.grammar is None or not drafts:
            return drafts
        n = seq.grammar.matcher.validate(drafts)
        self.grammar_cut += len(drafts) - n
        return drafts[:n]

    def accept(self, seq: Sequence, chunk: ScheduledChunk, tokens: list[int]) -> list[int]:
        """The run a verify chunk emits (``tokens``: the target's token at each of its rows); records it."""
        run = accepted_run(chunk, tokens)
        self.counters.record(chunk.num_draft, len(run) - 1)
        if seq.spec is not None:
            seq.spec.record(chunk.num_draft, len(run) - 1)
        return run

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        self.costs.observe(num_tokens, seconds)

    def finished(self, seq: Sequence) -> None:
        """A request ended (or was aborted): its text becomes n-gram memory, its draft shadow goes."""
        if seq.finish_reason is not None and self.cfg.method != DRAFT_MODEL:
            self.ngram.remember(seq.token_ids(), seq.cache_key)
        if self.draft is not None:
            self.draft.forget(seq.request_id)
        seq.spec = None


def _eligible(seq: Sequence) -> bool:
    """A row on its own (beams stay unspeculated), past its prompt and decoding its next token (a constrained
    row's forced run is first computed as a chunk of its own: the row drafts again the step after). A row still
    thinking under a budget or a grammar does not draft: the budget is checked, and the grammar starts, between
    steps (engine.sample.grammar_masks)."""
    th = seq.thinking
    return (seq.group is None and bool(seq.output_token_ids) and not prefilling(seq)
            and (th is None or (th.budget is None and seq.grammar is None) or th.answer_from is not None))


def build_speculator(cfg: SpeculativeConfig | None, engine_cfg: EngineConfig, device: torch.device,
                     num_blocks: int, vocab: int, tokenizer: PreTrainedTokenizerBase) -> Speculator | None:
    """The engine's speculator (None when speculation is off); loads the draft model for draft_model."""
    if cfg is None:
        return None
    draft = None
    if cfg.method == DRAFT_MODEL:
        from mindie_service.engine.spec.spec_draft import DraftModelProposer

        t0 = time.perf_counter()
        draft = DraftModelProposer(cfg.model, engine_cfg.dtype, device, engine_cfg.max_seq_len,
                                   min(engine_cfg.max_batch_size, 128), num_blocks, engine_cfg.cache_block_size,
                                   vocab, tokenizer)
        logger.info("draft model loaded in %.1fs", time.perf_counter() - t0)
    logger.info("speculative decoding: %s", replace(cfg))
    return Speculator(cfg, draft)


def draft_block_bytes(cfg: SpeculativeConfig | None, dtype: str, block_size: int, device: torch.device) -> int:
    """Bytes of one block of the draft model's KV pool (0 without a draft model): the engine takes its share out
    of the KV budget before either pool is built (engine.runner.engine_parts.load_parts)."""
    if cfg is None or cfg.method != DRAFT_MODEL or not cfg.model:
        return 0
    from mindie_service.engine.spec.spec_draft import kv_bytes_per_draft_block  # the draft's config only when used

    return kv_bytes_per_draft_block(cfg.model, dtype, device, block_size)

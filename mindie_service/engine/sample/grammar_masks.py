"""Structured output in the step: each constrained sequence carries a ``GrammarState`` (its matcher and the
allowed-token bitmask of the matcher's current state); this module is the engine's whole use of it.

    attach(seq)          at add_request: a matcher from the compile cache (refused with the grammar's reason)
    start_fill(seqs)     before the forward (``overlapFill`` on): the masks this step's sampling rows lack, filled
                         on the fill thread while the model runs (their matchers' states are known already);
                         ``join_fill`` after the forward waits for it
    mask_logits(...)     before the sampler: the sampling rows' masks, filled for the batch at once (native,
                         the GIL released; a mask computed at the end of the previous step is reused), applied
                         to the raw logits, so penalties, temperature, top-k and top-p see only allowed tokens
    after_step(...)      after scheduler.update: each sampled token consumed; then forced runs

Forced runs: while a matcher allows exactly one token, that token is appended without a forward (an event
each, logprob 0: probability 1 under the grammar) and the run is computed as one chunk next step. Only a
token that is the *only* one allowed is forced, so greedy (and sampled) output is what unforced constrained
decoding gives, token for token. A grammar that is done allows only EOS: the request ends with EOS at once.
Preemption by recompute keeps the output tokens, so the matcher, which has consumed exactly those, stays
right; chunked prefill never consumes (only sampled and forced tokens do).

Reasoning (engine.output.reasoning): a request still thinking is not masked and its matcher consumes nothing;
the grammar applies from the answer's first token (``ThinkTrack.answer_from``), so json_schema with thinking
gives free thinking, then valid JSON. A thinking budget that ran out forces the end marker's tokens here too,
before the grammar's own forced runs (``force_think_ends``).

A matcher that allows nothing (or failed) raises ``GrammarFailed`` for its rows before the sampler draws: the
engine's per-request isolation fails that request alone."""
from __future__ import annotations

import copy
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Callable, Union

import torch

from mindie_service.engine.contract import FailedEvent
from mindie_service.engine.sequence import Sequence, SeqStatus
from mindie_service.errors import ValidationError
from mindie_service.structured.backend import Matcher
from mindie_service.structured.compiler import GrammarCompiler

if TYPE_CHECKING:
    from mindie_service.engine.spec.speculator import DraftRow

# A sampling row: a sequence, or a verify row past its first (speculative decoding).
Row = Union[Sequence, "DraftRow"]
# after_step's hooks, built by the core: append a forced token (False: could not, or it ended the request); fail.
ForceHook = Callable[[Sequence, int], bool]
FailHook = Callable[[Sequence, str], None]

logger = logging.getLogger(__name__)
MAX_FORCED_PER_STEP = 256  # forced tokens one request may take in one step (the rest follow next step)


class GrammarFailed(RuntimeError):
    """Rows whose grammar allows no token (or whose matcher failed): request id -> reason."""

    def __init__(self, reasons: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in reasons.items()))
        self.reasons = reasons


@dataclass(eq=False)
class GrammarState:
    matcher: Matcher
    forced: bool  # forced runs on for this request (off when it asks for logprobs)
    mask: torch.Tensor | None = None  # int32 words of the current state's allowed tokens; None: not computed


@dataclass
class GrammarStats:
    fill_s: float = 0.0  # seconds filling masks (the batched native fill; on the fill thread when overlapped)
    fill_wait_s: float = 0.0  # seconds the step waited after its forward for an overlapped fill (join_fill)
    overlapped_rows: int = 0  # masks filled on the fill thread during a forward
    apply_s: float = 0.0  # seconds in mask_logits (fill + apply)
    masked_rows: int = 0
    draft_masks: int = 0  # masks filled for verify rows past the first (speculative decoding)
    forced_tokens: int = 0
    failed: int = 0
    extra: dict[str, float] = field(default_factory=dict)


@lru_cache(maxsize=1)
def _byte_bits() -> torch.Tensor:
    """byte -> its 8 bits, low first. Made on the first mask, not at import: a serve without structured output never
    runs these ops (their first calls fault in code pages and kernel state the RSS keeps)."""
    return ((torch.arange(256)[:, None] >> torch.arange(8)) & 1).bool()


def allowed_bits(masks: torch.Tensor, vocab: int) -> torch.Tensor:
    """int32 words [B, W] -> bool [B, vocab] (bits past the mask are False): a table lookup per byte."""
    table = _byte_bits().to(masks.device)
    bits = table[masks.contiguous().view(torch.uint8).long()].reshape(masks.shape[0], -1)
    if bits.shape[1] >= vocab:
        return bits[:, :vocab]
    return torch.cat([bits, bits.new_zeros(bits.shape[0], vocab - bits.shape[1])], 1)


def single_tokens(masks: torch.Tensor) -> list[int | None]:
    """Per row: the one allowed token when exactly one bit is set, else None (no unpacking: a row with one bit
    has one non-zero word, a power of two)."""
    nz = masks != 0
    one_word = (nz.sum(-1) == 1).tolist()
    where = nz.int().argmax(-1).tolist()
    out: list[int | None] = []
    for r, (single, w) in enumerate(zip(one_word, where)):
        v = int(masks[r, w]) & 0xFFFFFFFF if single else 0
        out.append(32 * w + v.bit_length() - 1 if v and v & (v - 1) == 0 else None)
    return out


class GrammarMasks:
    def __init__(self, compiler: GrammarCompiler, vocab_size: int, eos_token_ids: frozenset[int], forced_runs: bool,
                 overlap_fill: bool = False) -> None:
        self.compiler = compiler  # structured.compiler.GrammarCompiler, or None (no fast tokenizer)
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.forced_runs = forced_runs
        self.overlap_fill = overlap_fill and compiler is not None
        self.stats = GrammarStats()
        self._new: list[Sequence] = []
        self._fill_thread: ThreadPoolExecutor | None = None  # one thread: at most one fill in flight
        self._pending: Future | None = None

    @property
    def words(self) -> int:
        """int32 words a mask takes (read once a request has a matcher: the backend is built by then)."""
        return (self.compiler.vocab_size + 31) // 32 if self.compiler is not None else 0

    # ------------------------------------------------------------ requests
    def attach(self, seq: Sequence) -> None:
        spec = seq.params.structured_outputs
        if spec is None:
            return
        if self.compiler is None:
            raise ValidationError(f"Parameter {spec.where} must be absent: structured output needs a model with a "
                                  f"fast (Hugging Face tokenizers) tokenizer, which this one lacks")
        p = seq.params
        seq.grammar = GrammarState(self.compiler.matcher(spec),
                                   forced=self.forced_runs and p.logprobs is None and not p.prompt_logprobs)
        self._new.append(seq)

    # ------------------------------------------------------------ masks
    def _fill(self, states: list[GrammarState]) -> None:
        need = [s for s in states if s.mask is None]
        if not need:
            return
        t0 = time.perf_counter()
        buf = torch.zeros(len(need), self.words, dtype=torch.int32)
        self.compiler.fill_masks([(s.matcher, i) for i, s in enumerate(need)], buf)
        for i, s in enumerate(need):
            s.mask = buf[i]
        self.stats.fill_s += time.perf_counter() - t0

    def start_fill(self, seqs: list[Sequence]) -> None:
        """Start filling, on the fill thread, the masks that ``seqs`` (the step's sampling rows) lack, so that the
        native fill (GIL released) runs beside the forward. The same matchers, states and fill as ``mask_logits``
        would use, only earlier: the masks are the same. Nothing touches these matchers until ``join_fill``."""
        self.join_fill()
        if not self.overlap_fill:
            return
        states = [s.grammar for s in seqs if getattr(s, "grammar", None) is not None and s.grammar.mask is None]
        if not states:
            return
        if self._fill_thread is None:
            self._fill_thread = ThreadPoolExecutor(1, thread_name_prefix="mask-fill")
        self.stats.overlapped_rows += len(states)
        self._pending = self._fill_thread.submit(self._fill, states)

    def join_fill(self) -> None:
        """Wait for the fill ``start_fill`` began (its error, if any, raises here: the step fails as a whole and
        the engine retries each request alone)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            t0 = time.perf_counter()
            try:
                pending.result()
            finally:
                self.stats.fill_wait_s += time.perf_counter() - t0

    def mask_logits(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """``logits`` with the disallowed tokens of the constrained rows at -inf (itself when none is constrained)."""
        logits = think_end_only(logits, seqs)
        rows = [r for r, s in enumerate(seqs) if _grammar(s) is not None]
        if not rows:
            return logits
        t0 = time.perf_counter()
        states = [seqs[r].grammar for r in rows if not _is_draft(seqs[r])]
        self._fill(states)
        drafted = self._draft_masks([(r, seqs[r]) for r in rows if _is_draft(seqs[r])])
        _forced_rows_draw_nothing(seqs, drafted)
        masks = [drafted[r] if r in drafted else seqs[r].grammar.mask for r in rows]
        allowed = allowed_bits(torch.stack(masks).to(logits.device), logits.shape[1])
        reasons = {}
        for j, r in enumerate(rows):
            if r in drafted:  # a draft position: nothing allowed only past the grammar's end (never reached)
                if not bool(allowed[j].any()):
                    allowed[j] = True
                continue
            err = seqs[r].grammar.matcher.error()
            if err is not None or not bool(allowed[j].any()):
                reasons[seqs[r].request_id] = err or "the grammar allows no next token"
        if reasons:
            self.stats.failed += len(reasons)
            raise GrammarFailed(reasons)
        if len(rows) == len(seqs):
            banned = ~allowed
        else:
            banned = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
            banned[torch.tensor(rows, device=logits.device)] = ~allowed
        out = logits.masked_fill(banned, float("-inf"))
        self.stats.masked_rows += len(rows)
        self.stats.apply_s += time.perf_counter() - t0
        return out

    def _draft_masks(self, rows: list[tuple[int, Row]]) -> dict[int, torch.Tensor]:
        """Masks of verify rows past the first (engine.spec.speculator.DraftRow): the row ``depth`` drafts in gets
        its parent's grammar state after those drafts. Per parent: its matcher takes the first draft, one
        native call (the batch's parents at once) fills the states after each further draft, then the
        matcher is rolled back: it leaves as it came (the accepted run is consumed after the step)."""
        if not rows:
            return {}
        t0 = time.perf_counter()
        groups: dict[int, list[tuple[int, Row]]] = {}
        for r, d in rows:
            groups.setdefault(id(d.parent), []).append((r, d))
        buf = torch.zeros(len(rows), self.words, dtype=torch.int32)
        batch, single, where, advanced, base = [], [], {}, [], 0
        for items in groups.values():
            items.sort(key=lambda x: x[1].depth)
            parent, last = items[0][1].parent, items[-1][1]
            drafts = last.output_token_ids[len(last.output_token_ids) - last.depth:]
            m = parent.grammar.matcher
            if m.validate(drafts[:1]) == 1 and m.consume(drafts[0]):  # cut at propose: always allowed here
                advanced.append(m)
                if len(drafts) > 1:
                    batch.append((m, base, drafts[1:]))
                else:  # one draft: the state after it is the matcher's own now
                    single.append((m, base))
            for i, (r, _) in enumerate(items):  # the row after draft i + 1
                where[r] = base + i
            base += len(items)
        try:
            if batch:
                self.compiler.fill_draft_masks(batch, buf)
            if single:
                self.compiler.fill_masks(single, buf)
        finally:
            for m in advanced:
                m.rollback(1)
        self.stats.draft_masks += len(rows)
        self.stats.fill_s += time.perf_counter() - t0
        return {r: buf[i] for r, i in where.items()}

    # ------------------------------------------------------------ after the step
    def after_step(self, seqs: dict[str, Sequence], sampled: dict[str, list[int]], force: ForceHook,
                   fail: FailHook) -> None:
        """Consume each constrained row's sampled token, then force what the grammars force. ``force(seq, t)``
        appends ``t`` as a forced token (False: it could not, or the request finished); ``fail(seq, why)``."""
        due: list[Sequence] = []
        for rid, got in sampled.items():
            seq = seqs.get(rid)
            if seq is None or seq.grammar is None or seq.status is not SeqStatus.RUNNING:
                continue
            seq.grammar.mask = None
            # the step's run of tokens: one, or a verify row's accepted drafts and the target's token; the answer's
            run = answer_part(seq, got if isinstance(got, list) else [got])
            if run is None:
                continue
            bad = next((t for t in run if not seq.grammar.matcher.consume(t)), None)
            if bad is not None:
                fail(seq, seq.grammar.matcher.error() or f"token {bad} is not allowed by the grammar")
                continue
            due.append(seq)
        new, self._new = self._new, []
        due += [s for s in new if s.status is SeqStatus.WAITING and not s.block_table and not s.output_token_ids]
        due += [s for s in force_think_ends(seqs, force) if s.grammar is not None and s not in due]
        self._force(due, force)

    def _force(self, due: list[Sequence], force: ForceHook) -> None:
        active = [s for s in due if s.grammar.forced and _grammar(s) is not None]
        for _ in range(MAX_FORCED_PER_STEP):
            if not active:
                return
            self._fill([s.grammar for s in active])
            nxt = []
            for s, t in zip(active, single_tokens(torch.stack([s.grammar.mask for s in active]))):
                if t is not None and t < self.vocab_size and s.grammar.matcher.error() is None and force(s, t):
                    s.grammar.mask = None
                    if not s.grammar.matcher.consume(t):  # cannot happen: t was the one allowed token
                        logger.warning("request %s: forced token %d refused by its matcher", s.request_id, t)
                        continue
                    self.stats.forced_tokens += 1
                    nxt.append(s)
            active = nxt


def _grammar(row: Row) -> GrammarState | None:
    """The grammar masking a sampler row: a sequence's own, or for a draft row its parent's; none while the
    sequence is still thinking (the grammar applies to the answer only)."""
    parent = getattr(row, "parent", None)
    seq = parent if parent is not None else row
    th = getattr(seq, "thinking", None)
    return None if th is not None and th.answer_from is None else getattr(seq, "grammar", None)


def answer_part(seq: Sequence, run: list[int]) -> list[int] | None:
    """The tokens of ``run`` (the last ``len(run)`` output tokens) that belong to the answer; None: none do."""
    th = seq.thinking
    if th is None:
        return run
    if th.answer_from is None:
        return None
    first = len(seq.output_token_ids) - len(run)
    return run[max(0, th.answer_from - first):] or None


def think_end_only(logits: torch.Tensor, seqs: list[Row]) -> torch.Tensor:
    """Rows whose thinking budget ran out before the step (a budget of 0, or forcing found no slot) may draw only
    the end marker's next token: the budget holds on the sampled path too."""
    due = [(r, s.thinking.next_forced()) for r, s in enumerate(seqs)
           if not _is_draft(s) and getattr(s, "thinking", None) is not None and s.thinking.due()]
    if not due:
        return logits
    logits = logits.clone()
    for r, t in due:
        keep = logits[r, t].clone()
        logits[r] = float("-inf")
        logits[r, t] = keep if bool(torch.isfinite(keep)) else 0.0
    return logits


def force_think_ends(seqs: dict[str, Sequence], force: ForceHook) -> list[Sequence]:
    """Each sequence whose thinking budget ran out gets the end marker's tokens, forced (no forward, logprob 0):
    its thinking then has exactly ``budget`` tokens. Returns those whose thinking ended so."""
    done = []
    for seq in [s for s in seqs.values() if s.thinking is not None and s.thinking.due()]:
        for t in seq.thinking.end_ids:
            if not seq.thinking.thinking or not force(seq, t):
                break
        if not seq.thinking.thinking and seq.status in (SeqStatus.RUNNING, SeqStatus.WAITING):
            done.append(seq)
    return done


def _is_draft(row: Row) -> bool:
    return getattr(row, "parent", None) is not None


def _forced_rows_draw_nothing(seqs: list[Row], drafted: dict[int, torch.Tensor]) -> None:
    """A sampled row with forced runs does not draw where its grammar forces the token (the forced path appends
    it without a draw): a verify row at such a state takes its one allowed token greedily, so the request's
    generator draws what it would without speculation."""
    rows = [r for r in drafted if seqs[r].parent.grammar.forced and not seqs[r].params.greedy]
    if not rows:
        return
    for r, t in zip(rows, single_tokens(torch.stack([drafted[r] for r in rows]))):
        if t is not None:
            params = copy.copy(seqs[r].params)
            params.temperature = 0.0
            seqs[r].params = params


def fail_event(request_id: str, why: str) -> FailedEvent:
    return FailedEvent(request_id, f"Request {request_id} failed: structured output: {why}")

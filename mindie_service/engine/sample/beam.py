"""Beam search in the continuous batch, with Hugging Face ``generate``'s semantics (transformers >= 4.50's
vectorised ``_beam_search``: 2 x num_beams candidates per step, a candidate that hits EOS or the length
cap enters the finished set only if it ranks among the top num_beams, final score
``sum logprob / generated_length ** length_penalty``, and its ``early_stopping`` rules).

Each beam is an ordinary ``Sequence`` in the scheduler's running set, a member of its request's
``BeamGroup`` (the scheduler's ``SequenceGroup`` plus the search state), so beams batch with other
requests and count against maxBatchSize. When beams are re-ranked, a beam kept by one child continues
in place; another child of the same parent forks: it shares every full KV block of its parent (reference
counts) and gets a fresh block for the partly filled one, whose tokens it recomputes (copy-on-write by
recomputation: a shared block is never written). A group whose beam is preempted restarts from its prompt
(the search is deterministic, and nothing was sent), so beams of one group are always sampled together."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch

from mindie_service.engine.sequence import Sequence, SequenceGroup, SeqStatus
from mindie_service.engine.contract import FINISH_LENGTH, EngineRequest, TokenEvent
from mindie_service.engine.output.stop_rule import length_reached
from mindie_service.errors import check

if TYPE_CHECKING:
    from mindie_service.engine.output.output_processor import OutputProcessor
    from mindie_service.engine.sched.scheduler import Scheduler
    from mindie_service.engine.sessions.session_store import SessionStore

logger = logging.getLogger(__name__)

_NEG = -1.0e9


@dataclass
class Hypothesis:
    tokens: list[int]
    logprobs: list[float]


@dataclass
class BeamScorer:
    """The search state of one request, HF's tensors for a batch of one."""

    num_beams: int
    max_new: int
    eos: frozenset[int]
    length_penalty: float
    early_stopping: bool | str
    running_scores: torch.Tensor = field(init=False)  # [num_beams] float32
    finished_scores: torch.Tensor = field(init=False)  # [num_beams]
    finished_done: torch.Tensor = field(init=False)  # [num_beams] bool
    finished: list[Hypothesis | None] = field(init=False)
    unsatisfied: bool = True  # HF's is_early_stop_heuristic_unsatisfied
    gen_len: int = 0
    done: bool = False

    def __post_init__(self) -> None:
        k = self.num_beams
        self.running_scores = torch.full((k,), _NEG, dtype=torch.float32)
        self.running_scores[0] = 0.0
        self.finished_scores = torch.full((k,), _NEG, dtype=torch.float32)
        self.finished_done = torch.zeros(k, dtype=torch.bool)
        self.finished = [None] * k

    def step(self, logits: torch.Tensor, beams: list[Hypothesis]) -> list[tuple[int, int, float]]:
        """``logits`` [len(beams), vocab] of the running beams (one row before the first step: HF's other
        beams are copies of it at -1e9). Returns the next running beams as (parent index, token, logprob)."""
        k = self.num_beams
        beams = beams + [beams[0]] * (k - len(beams))
        logp = torch.log_softmax(logits.to(torch.float32), dim=-1)
        if logp.shape[0] < k:
            logp = torch.cat([logp, logp[:1].expand(k - logp.shape[0], -1)])
        vocab = logp.shape[1]
        acc = (logp + self.running_scores[:, None]).reshape(-1)
        keep = max(2, 1 + len(self.eos)) * k
        top_scores, top_idx = torch.topk(acc, keep)
        parents = (top_idx // vocab).tolist()
        tokens = (top_idx % vocab).tolist()
        hit_list = [t in self.eos or length_reached(self.gen_len + 1, self.max_new) for t in tokens]
        hits = torch.tensor(hit_list, dtype=torch.bool)
        step_lp = [float(logp[p, t]) for p, t in zip(parents, tokens)]

        # The next running beams: the best num_beams candidates that did not stop.
        run_scores = top_scores + hits.to(torch.float32) * _NEG
        nxt = torch.topk(run_scores, k)[1].tolist()
        new_running_scores = run_scores[nxt]

        # Finished hypotheses: merge the stopping candidates among the top num_beams into the best k.
        cand = top_scores / ((self.gen_len + 1) ** self.length_penalty)
        full = bool(self.finished_done.all()) and self.early_stopping is True
        cand = cand + float(full) * _NEG
        cand = cand + float(not self.unsatisfied) * _NEG
        eligible = hits & (torch.arange(keep) < k)
        cand = cand + (~eligible).to(torch.float32) * _NEG
        merged = torch.cat([self.finished_scores, cand])
        sel = torch.topk(merged, k)[1].tolist()
        old = list(self.finished)
        old_done = self.finished_done.clone()
        self.finished_scores = merged[sel]
        self.finished = []
        done_flags = []
        for j in sel:
            if j < k:
                self.finished.append(old[j])
                done_flags.append(bool(old_done[j]))
            else:
                c = j - k
                b = beams[parents[c]]
                self.finished.append(Hypothesis(b.tokens + [tokens[c]], b.logprobs + [step_lp[c]]))
                done_flags.append(bool(eligible[c]))
        self.finished_done = torch.tensor(done_flags, dtype=torch.bool)

        self.running_scores = new_running_scores
        self.gen_len += 1
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            hyp_len = self.max_new
        else:
            hyp_len = self.gen_len
        best_possible = self.running_scores[0] / (hyp_len ** self.length_penalty)
        worst = torch.where(self.finished_done, self.finished_scores.min(), torch.tensor(_NEG))
        self.unsatisfied = self.unsatisfied and bool((best_possible > worst).any())
        all_full = bool(self.finished_done.all()) and self.early_stopping is True
        self.done = not (self.unsatisfied and not all_full and not all(hit_list))
        return [(parents[j], tokens[j], step_lp[j]) for j in nxt]

    def best(self) -> Hypothesis:
        h = self.finished[0]
        assert h is not None
        return h


@dataclass(eq=False, kw_only=True)
class BeamGroup(SequenceGroup):
    """One beam-search request: the scheduler's group of its beams (``members``, in beam order), plus its
    scorer and the generated tokens of each running beam."""

    scorer: BeamScorer
    hyps: list[Hypothesis] = field(default_factory=list)

    def restart(self) -> Sequence:
        """(Re)start: one beam holding the prompt; the search state starts over."""
        s = self.scorer
        self.scorer = BeamScorer(s.num_beams, s.max_new, s.eos, s.length_penalty, s.early_stopping)
        self.hyps = [Hypothesis([], [])]
        return super().restart()


class BeamSearch:
    """The engine's beam-search requests: started by ``add``, advanced once per step by ``advance`` with
    the logits of every live beam, ended by returning the chosen beam's events (or by ``abort``)."""

    def __init__(self, scheduler: "Scheduler", outputs: "OutputProcessor", eos: frozenset[int],
                 sessions: "SessionStore | None" = None) -> None:
        self.scheduler, self.outputs, self.eos, self.sessions = scheduler, outputs, eos, sessions
        self.groups: dict[str, BeamGroup] = {}

    def add(self, root: Sequence) -> None:
        """``root`` carries the request (its id is the client's); it is never scheduled itself."""
        p = root.params
        scorer = BeamScorer(p.num_beams, root.max_output, frozenset() if p.ignore_eos else self.eos,
                            p.length_penalty, p.early_stopping)
        group = BeamGroup(root, p.num_beams, scorer=scorer)
        self.groups[root.request_id] = group
        self.scheduler.add(group.restart())

    def searching(self, group: SequenceGroup) -> bool:
        """Whether ``group``'s search is still on (not finished, aborted or failed)."""
        return self.groups.get(group.request_id) is group

    def abort(self, request_id: str) -> bool:
        """End the search of the client's ``request_id``; False when there is none."""
        group = self.groups.pop(request_id, None)
        if group is None:
            return False
        for b in group.members:
            if b.status is not SeqStatus.FINISHED:
                self.scheduler.finish(b)
        self.outputs.drop(request_id)
        return True

    def advance(self, group: SequenceGroup, rows: dict[Sequence, torch.Tensor]) -> list[TokenEvent]:
        """One search step after the scheduler's update: re-rank, fork/continue/drop beams; at the end, the
        chosen beam's events (all at once). ``group`` is one of this search's groups (``searching``)."""
        assert isinstance(group, BeamGroup)
        live = group.members
        if any(b.status is not SeqStatus.RUNNING or b not in rows for b in live):
            logger.debug("%s: beams out of step, restarting the search", group.request_id)
            self.scheduler.restart_group(group)
            return []
        k = group.scorer.num_beams
        padded = live + [live[0]] * (k - len(live))
        hyps = group.hyps + [group.hyps[0]] * (k - len(group.hyps))
        nxt = group.scorer.step(torch.stack([rows[b] for b in live]), hyps)
        if group.scorer.done:
            return self._finish(group)
        used: set[int] = set()
        plan: list[tuple[Sequence, int, bool]] = []
        for p, tok, _ in nxt:
            parent = padded[p]
            plan.append((parent, tok, id(parent) in used))
            used.add(id(parent))
        new_beams: list[Sequence] = []
        for parent, tok, fork in plan:  # forks first: they copy the parent's tokens before it moves on
            if fork:
                child = group.new_member(parent.output_token_ids + [tok])
                if not self.scheduler.fork(parent, child):
                    for b in new_beams:
                        self.scheduler.finish(b)
                    self.scheduler.restart_group(group)
                    return []
                new_beams.append(child)
        forks = iter(new_beams)
        beams = []
        for parent, tok, fork in plan:
            if fork:
                beams.append(next(forks))
            else:
                parent.output_token_ids.append(tok)
                beams.append(parent)
        for b in live:
            if id(b) not in used:
                self.scheduler.finish(b)
        group.members = beams
        group.hyps = [Hypothesis(hyps[p].tokens + [tok], hyps[p].logprobs + [lp]) for p, tok, lp in nxt]
        return []

    def _finish(self, group: BeamGroup) -> list[TokenEvent]:
        for b in group.members:
            if b.status is not SeqStatus.FINISHED:
                self.scheduler.finish(b)
        del self.groups[group.request_id]
        best = group.scorer.best()
        view = group.root
        events: list[TokenEvent] = []
        for tid, lp in zip(best.tokens, best.logprobs):
            ev = self.outputs.token(view, tid, lp, [])
            view.output_token_ids.append(tid)
            events.append(ev)
            if ev.finish_reason is not None:
                break
        if events and events[-1].finish_reason is None:  # a search ended by its scorer (HF's finalize) short of the rule
            events[-1].finish_reason = FINISH_LENGTH
            self.outputs.drop(group.request_id)
        if view.session_id is not None and self.sessions is not None:
            self.sessions.keep(view)  # its tokens only: the beams' blocks are gone
        return events


def check_beam_request(req: "EngineRequest", max_output: int, blocks_needed: "Callable[[int], int]",
                       num_blocks: int, max_batch_size: int) -> None:
    """What beam search does not combine with, refused by name (422), before anything is bound."""
    p = req.params
    k = p.num_beams
    check(p.adapter_id is None, "num_beams", "1 with a LoRA adapter (beam search runs on the base model)", k)
    check(p.min_tokens == 0, "num_beams", "1 with min_tokens (beam search ranks hypotheses that end on EOS)", k)
    check(req.mm_inputs is None, "num_beams", "1 for inputs holding media", k)
    check(not p.logprobs and not p.prompt_logprobs, "num_beams", "1 when logprobs or prompt logprobs are asked", k)
    check(p.repetition_penalty == 1.0 and p.frequency_penalty == 0.0, "num_beams",
          "1 with a repetition or frequency penalty (beam search scores raw log-probabilities)", k)
    check(k <= max_batch_size, "num_beams", f"<= maxBatchSize ({max_batch_size}): every beam takes a batch row", k)
    need = k * blocks_needed(len(req.prompt_token_ids) + max_output)
    check(need <= num_blocks, "num_beams",
          f"small enough that its beams fit the KV pool ({num_blocks} blocks; {need} needed)", k)

"""Output processing: a sampled token -> a TokenEvent (text delta, logprobs, finish reason).

Owns each request's detokenizer state and the prompt logprobs gathered over its prefill chunks.
It decides when a request finishes by the one stop rule (engine.output.stop_rule) but changes no engine
state: the engine hands its verdicts to ``Scheduler.update``. The one reasoning split lives here too
(engine.output.reasoning): each text delta is cut into thinking and answer, and the request's ``ThinkTrack``
(the one thing written on the Sequence) follows where the thinking ends, for the budget and the grammar."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from mindie_service.engine.output.detokenizer import DetokState, TokenDecoder, flush, step as detok_step
from mindie_service.engine.sequence import Sequence
from mindie_service.engine.step import ScheduledChunk
from mindie_service.engine.contract import TokenEvent, TokenInfo
from mindie_service.engine.output.stop_rule import StopCheck, stop_reason
from mindie_service.engine.output.reasoning import THINK, ThinkSplit, ThinkTrack, detect, start_phase
from mindie_service.errors import ValidationError
from mindie_service.sampling_params import SamplingParams

PROMPT_TAIL = 16  # prompt tokens read for where generation starts (inside <think> or not)


@dataclass
class _Tracked:
    detok: DetokState
    first_event_sent: bool = False
    prompt_lps: list[float | None] = field(default_factory=list)  # position i: logprob of prompt token i
    prompt_tops: list[list[tuple[int, float]]] = field(default_factory=list)  # position i: its top alternatives
    split: ThinkSplit | None = None  # the reasoning split (a model with markers, a request that asks)
    show: bool = False  # the split is handed out (else the text stays whole: only the budget reads it)


class OutputProcessor:
    def __init__(self, tokenizer: Any, eos_token_ids: frozenset[int], reasoning_parser: str = "") -> None:
        self.decoder = TokenDecoder(tokenizer)
        self.eos_token_ids = eos_token_ids
        self.tracked: dict[str, _Tracked] = {}
        self.parser = detect(getattr(tokenizer, "chat_template", None), reasoning_parser)
        self.end_ids: tuple[int, ...] = ()
        self.marker_ids: tuple[int, ...] = ()  # markers that are one special token each: their text is kept
        if self.parser is not None:
            self.end_ids = tuple(tokenizer.encode(self.parser.end, add_special_tokens=False))
            ids = [tokenizer.encode(m, add_special_tokens=False) for m in (self.parser.start, self.parser.end)]
            self.marker_ids = tuple(i[0] for i in ids if len(i) == 1 and i[0] in self.decoder.special_ids)

    def check(self, p: SamplingParams) -> None:
        """Refuse what this model's output cannot honour (before the request takes anything)."""
        if p.thinking_budget is not None and self.parser is None:
            raise ValidationError("Parameter thinking budget (thinking_token_budget, budget_tokens, thinking_budget, "
                                  "reasoning_effort or reasoning.effort) must be absent: this model's chat template "
                                  "does not think (no reasoning markers)")

    def add(self, seq: Sequence) -> None:
        p = seq.params
        spec = p.structured_outputs  # a tool grammar's special marker keeps its text
        keep = (*(getattr(spec, "keep_special", ()) if spec is not None else ()), *self.marker_ids)
        t = _Tracked(DetokState.start(seq.prompt_token_ids, p.stop, keep))
        if self.parser is not None and (p.split_reasoning or p.thinking_budget is not None):
            tail = self.decoder.tokenizer.decode(seq.prompt_token_ids[-PROMPT_TAIL:], skip_special_tokens=False)
            phase = start_phase(self.parser, tail)
            t.split, t.show = ThinkSplit(self.parser, phase), p.split_reasoning
            seq.thinking = ThinkTrack(self.end_ids, p.thinking_budget, thinking=phase == THINK,
                                      answer_from=None if phase == THINK else 0)
        self.tracked[seq.request_id] = t

    def drop(self, request_id: str) -> None:
        self.tracked.pop(request_id, None)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.tracked

    def prompt_chunk(self, seq: Sequence, chunk: ScheduledChunk, logits: torch.Tensor) -> None:
        """Logprobs of the prompt tokens that ``chunk``'s rows predict (row p predicts token p + 1), and their
        top ``params.logprobs`` alternatives (OpenAI's legacy ``echo`` + ``logprobs: N`` scores each prompt
        token as it scores a generated one)."""
        t = self.tracked[seq.request_id]
        if chunk.start == 0:
            t.prompt_lps, t.prompt_tops = [None], [[]]
        nxt = torch.tensor(seq.prompt_token_ids[chunk.start + 1:chunk.start + 1 + logits.shape[0]],
                           device=logits.device)
        lps = logits.float().log_softmax(-1)
        t.prompt_lps += lps.gather(1, nxt[:, None])[:, 0].tolist()
        k = seq.params.logprobs or 0
        if k > 0:
            vals, ids = lps.topk(k, dim=-1)
            t.prompt_tops += [list(zip(i, v)) for i, v in zip(ids.tolist(), vals.tolist())]
        else:
            t.prompt_tops += [[] for _ in range(logits.shape[0])]

    def token(self, seq: Sequence, tid: int, logprob: float | None, top: list[tuple[int, float]],
              pending: int = 0) -> TokenEvent:
        """The event for ``tid``, sampled for ``seq`` after ``pending`` tokens of the same step (an accepted
        speculative run) that are not yet appended to it either; sets ``finish_reason``."""
        t = self.tracked[seq.request_id]
        delta = detok_step(self.decoder, t.detok, tid)
        n_out = len(seq.output_token_ids) + 1 + pending
        p = seq.params
        finish = stop_reason(StopCheck(tid, n_out, seq.max_output, t.detok.stopped, p.min_tokens), self.eos_token_ids,
                             p.ignore_eos, p.stop_token_ids)
        if finish is not None:
            delta += flush(self.decoder, t.detok)
        thought = ""
        if t.split is not None:
            thought, answer = t.split.feed(delta, final=finish is not None)
            if seq.thinking is not None:  # a finished beam search's view carries none (text split only)
                seq.thinking.token(tid, n_out - 1, t.split.phase)
            delta = answer if t.show else delta
            thought = thought if t.show else ""
        ev = TokenEvent(seq.request_id, self._info(tid, logprob, top), delta, n_out - 1, finish,
                        reasoning_delta=thought)
        if not t.first_event_sent:
            t.first_event_sent = True
            ev.num_prompt_tokens, ev.seed = seq.num_prompt_tokens, seq.seed
            ev.num_cached_tokens = min(seq.num_cached_tokens, seq.num_prompt_tokens)
            if seq.scheduled_at:  # an engine with a clock (the serving engine's is time.monotonic)
                ev.queued_at, ev.scheduled_at = seq.arrival, seq.scheduled_at
            if seq.params.prompt_logprobs:
                lps = t.prompt_lps + [None] * (seq.num_prompt_tokens - len(t.prompt_lps))
                tops = t.prompt_tops + [[]] * (seq.num_prompt_tokens - len(t.prompt_tops))
                ev.prompt_tokens = [self._info(i, lp, top)
                                    for i, lp, top in zip(seq.prompt_token_ids, lps, tops)]
        if finish is not None:
            ev.full_text = t.detok.text
            if t.show:
                ev.full_text, ev.full_reasoning = t.split.answer, t.split.reasoning
            if seq.thinking is not None:
                ev.reasoning_tokens = seq.thinking.count
            del self.tracked[seq.request_id]
        return ev

    def _info(self, tid: int, logprob: float | None, top: list[tuple[int, float]] = ()) -> TokenInfo:
        d = self.decoder
        return TokenInfo(tid, logprob, d.token_text(tid), tid in d.special_ids,
                         tuple(TokenInfo(i, lp, d.token_text(i), i in d.special_ids) for i, lp in top))

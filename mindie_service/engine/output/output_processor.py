"""Output processing: a sampled token -> a TokenEvent (text delta, logprobs, finish reason).

Owns each request's detokenizer state and the prompt logprobs gathered over its prefill chunks.
It decides when a request finishes by the one stop rule (engine.output.stop_rule) but changes no engine
state: the engine hands its verdicts to ``Scheduler.update``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from mindie_service.engine.output.detokenizer import DetokState, TokenDecoder, flush, step as detok_step
from mindie_service.engine.sequence import Sequence
from mindie_service.engine.step import ScheduledChunk
from mindie_service.engine.contract import TokenEvent, TokenInfo
from mindie_service.engine.output.stop_rule import StopCheck, stop_reason


@dataclass
class _Tracked:
    detok: DetokState
    first_event_sent: bool = False
    prompt_lps: list[float | None] = field(default_factory=list)  # position i: logprob of prompt token i
    prompt_tops: list[list[tuple[int, float]]] = field(default_factory=list)  # position i: its top alternatives


class OutputProcessor:
    def __init__(self, tokenizer: Any, eos_token_ids: frozenset[int]) -> None:
        self.decoder = TokenDecoder(tokenizer)
        self.eos_token_ids = eos_token_ids
        self.tracked: dict[str, _Tracked] = {}

    def add(self, seq: Sequence) -> None:
        spec = seq.params.structured_outputs  # a tool grammar's special marker keeps its text
        keep = getattr(spec, "keep_special", ()) if spec is not None else ()
        self.tracked[seq.request_id] = _Tracked(DetokState.start(seq.prompt_token_ids, seq.params.stop, keep))

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
        ev = TokenEvent(seq.request_id, self._info(tid, logprob, top), delta, n_out - 1, finish)
        if not t.first_event_sent:
            t.first_event_sent = True
            ev.num_prompt_tokens, ev.seed = seq.num_prompt_tokens, seq.seed
            ev.num_cached_tokens = min(seq.num_cached_tokens, seq.num_prompt_tokens)
            if seq.params.prompt_logprobs:
                lps = t.prompt_lps + [None] * (seq.num_prompt_tokens - len(t.prompt_lps))
                tops = t.prompt_tops + [[]] * (seq.num_prompt_tokens - len(t.prompt_tops))
                ev.prompt_tokens = [self._info(i, lp, top)
                                    for i, lp, top in zip(seq.prompt_token_ids, lps, tops)]
        if finish is not None:
            ev.text_delta += flush(self.decoder, t.detok)
            ev.full_text = t.detok.text
            del self.tracked[seq.request_id]
        return ev

    def _info(self, tid: int, logprob: float | None, top: list[tuple[int, float]] = ()) -> TokenInfo:
        d = self.decoder
        return TokenInfo(tid, logprob, d.token_text(tid), tid in d.special_ids,
                         tuple(TokenInfo(i, lp, d.token_text(i), i in d.special_ids) for i, lp in top))

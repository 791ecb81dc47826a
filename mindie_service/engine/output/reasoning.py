"""Thinking apart from the answer: the one split, in output processing (issue 45's reasoning).

A model whose chat template thinks writes ``<think> ... </think>`` before its answer (Qwen3, DeepSeek-R1). Which
markers a model uses is decided once per model (``detect``: the config key
``ModelDeployConfig.structuredOutput.reasoningParser``, else its chat template), like vLLM's
``--reasoning-parser``; a model without markers has no split. Per request:

- ``ThinkSplit`` cuts the detokenized text as the output processor hands it out into a thinking part and an
  answer part. Where generation starts is read from the prompt's tail: a template that opened ``<think>`` (R1,
  Qwen3 thinking-2507, ``tiny-think``) starts inside; one that closed it (Qwen3 with ``enable_thinking`` false)
  starts in the answer; otherwise the output may open it first (after blanks). Text that may still be the
  start of a marker is held back, so a marker split across tokens or chunks never leaks into either part, and
  whole == streamed for any chunking. Text between the markers is thinking, exactly (no blanks trimmed).
- ``ThinkTrack`` (on the Sequence) is what the engine reads: whether the output is still thinking, from which
  output index the answer starts (structured output applies from there: engine.sample.grammar_masks), and the
  thinking tokens so far against the request's budget (engine.sample.grammar_masks.force_think_ends forces the
  end marker's tokens when it runs out). The end is seen by token ids (the marker's tokens at the output's tail) or by the
  text split, whichever comes first; the end marker's tokens are not thinking tokens."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

THINK, ANSWER, OPEN = "think", "answer", "open"  # OPEN: no marker yet; the output may open one first


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    start: str
    end: str


PARSERS: dict[str, ReasoningParser] = {
    "qwen3": ReasoningParser("qwen3", "<think>", "</think>"),  # enable_thinking: the template opens or closes it
    "deepseek_r1": ReasoningParser("deepseek_r1", "<think>", "</think>"),  # the template opens <think>
}
NONE = "none"


def detect(chat_template: Any, configured: str = "") -> ReasoningParser | None:
    """The model's markers: the configured parser (``none``: no split), else found in its chat template."""
    if configured == NONE:
        return None
    if configured:
        return PARSERS[configured]
    if not isinstance(chat_template, str) or "</think>" not in chat_template:
        return None
    return PARSERS["qwen3" if "enable_thinking" in chat_template else "deepseek_r1"]


def start_phase(parser: ReasoningParser, prompt_tail: str) -> str:
    """Where generation starts, from the prompt's tail (decoded with its special tokens)."""
    s, e = prompt_tail.rfind(parser.start), prompt_tail.rfind(parser.end)
    if s > e:
        return THINK
    return ANSWER if e >= 0 else OPEN


def _partial(buf: str, marker: str) -> int:
    """Length of the longest proper prefix of ``marker`` that ``buf`` ends with."""
    for k in range(min(len(marker) - 1, len(buf)), 0, -1):
        if buf.endswith(marker[:k]):
            return k
    return 0


@dataclass
class ThinkSplit:
    parser: ReasoningParser
    phase: str
    buf: str = ""  # held back: may still become a marker
    reasoning: str = ""  # thinking handed out so far
    answer: str = ""  # answer handed out so far

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """(thinking delta, answer delta) for the next ``text``; ``final``: nothing follows (flush all)."""
        think, ans = [], []
        self.buf += text
        while self.buf:
            if self.phase == ANSWER:
                ans.append(self.buf)
                self.buf = ""
            elif self.phase == OPEN:
                lead = self.buf.lstrip()
                if lead.startswith(self.parser.start):
                    self.phase, self.buf = THINK, lead[len(self.parser.start):]
                elif not final and self.parser.start.startswith(lead):
                    break  # blanks, or the marker's first characters: wait
                else:
                    self.phase = ANSWER
            else:
                i = self.buf.find(self.parser.end)
                if i >= 0:
                    think.append(self.buf[:i])
                    self.phase, self.buf = ANSWER, self.buf[i + len(self.parser.end):]
                    continue
                keep = 0 if final else _partial(self.buf, self.parser.end)
                think.append(self.buf[:len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep:]
                break
        r, a = "".join(think), "".join(ans)
        self.reasoning += r
        self.answer += a
        return r, a


@dataclass
class ThinkTrack:
    """The engine's view of one request's thinking (engine.sample.grammar_masks, engine.sample.think_budget)."""

    end_ids: tuple[int, ...]  # the end marker's tokens (what the budget forces)
    budget: int | None = None  # thinking tokens allowed; None: no budget
    thinking: bool = False
    answer_from: int | None = 0  # output index where the answer starts (None: not yet)
    count: int = 0  # thinking tokens so far (the end marker's tokens not counted)
    tail: list[tuple[int, bool]] = field(default_factory=list)  # the last output tokens: (id, counted)

    def due(self) -> bool:
        """The budget ran out while thinking: the end marker must be forced now."""
        return self.thinking and self.budget is not None and self.count >= self.budget

    def next_forced(self) -> int:
        """The end marker's token due next (the budget ran out): the one after the marker's part already out."""
        got = [t for t, _ in self.tail]
        k = next((k for k in range(min(len(got), len(self.end_ids) - 1), 0, -1)
                  if got[-k:] == list(self.end_ids[:k])), 0)
        return self.end_ids[k]

    def token(self, tid: int, index: int, text_phase: str) -> None:
        """Output token ``index`` arrived; ``text_phase``: the split's phase after its text."""
        if not self.thinking:
            if text_phase == THINK and self.answer_from == 0:  # the output opened the marker itself
                self.thinking, self.answer_from, self.tail = True, None, []
            return
        n = len(self.end_ids)
        window = (self.tail + [(tid, False)])[-n:] if n else []
        if (n and tuple(t for t, _ in window) == self.end_ids) or text_phase == ANSWER:
            if n and tuple(t for t, _ in window) == self.end_ids:  # the marker's own tokens are not thinking
                self.count -= sum(c for _, c in window)
            self.thinking, self.answer_from, self.tail = False, index + 1, []
            return
        counted = self.budget is None or self.count < self.budget
        self.count += counted
        self.tail = (self.tail + [(tid, counted)])[-n:] if n else []

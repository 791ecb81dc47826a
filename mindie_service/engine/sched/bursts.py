"""Multi-step decode: a step of a few plain greedy decodes runs several decode steps in one runner call.

At one stream a decode step of SmolLM2-135M takes about 5 ms, and about 0.6 ms of it is the engine's Python
(scheduling, sampling, outputs), every piece slow because the step's weights have just streamed through the
caches. Running ``decodeSteps`` steps per call (vLLM's multi-step scheduling; each step's argmax is the next
step's token, inside the runner) pays that once per burst. The tokens are the ones single steps would give:
the same kernels, the same first-maximum argmax; the engine cuts a burst at the token that finishes the
request (EOS, a stop string, max_tokens) and the scheduler trims the slots past it, as for rejected drafts.

Taken only where nothing else would notice: at most ``MAX_ROWS`` decodes, no prefill in the step and nothing
waiting or swapped, every row plain greedy (no logprobs, penalties, bias, grammar, LoRA, beams or drafts), and
steps fast enough that a burst stays within BURST_BUDGET_S (a request arriving during one waits at most that).
Rows that asked to come after default traffic (request rank > 0, batch-job lines) never burst: a more urgent
request arriving meanwhile waits for one of their steps, not a burst of them (engine.sched.urgent_first).
Plain Python (no torch): the scheduler's side."""
from __future__ import annotations

import statistics
from collections import deque

from mindie_service.engine.contract import PRIORITY_ONLINE
from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.sequence import Sequence

MAX_ROWS = 4  # with more rows a step's Python is spread over them, and bursts would delay more requests
# A burst's wall time at most: what a request arriving during one may wait (a short prompt's time to first token
# is about 30 ms here). Bursts pay off where a step is a few milliseconds (the engine's Python is then a tenth of
# it); a slower model's steps run one a call.
BURST_BUDGET_S = 0.040


class BurstPacer:
    """The steps a burst may take now: as many as the median of the last decode steps measured fits in
    BURST_BUDGET_S, at most ``configured`` and at least 1 (a median: a one-off slow step, such as the first one that
    builds the fused step's tables or a kernel library, does not hold bursts off)."""

    WINDOW = 5

    def __init__(self, configured: int) -> None:
        self.configured = configured
        self.recent: deque[float] = deque(maxlen=self.WINDOW)

    @property
    def step_s(self) -> float:
        return statistics.median(self.recent) if self.recent else 0.0

    def observe(self, seconds: float, steps: int) -> int:
        """A decode-only step of ``steps`` steps took ``seconds``: the steps the next may take."""
        self.recent.append(seconds / max(1, steps))
        step = self.step_s
        fit = int(BURST_BUDGET_S / step) if step > 0 else self.configured
        return max(1, min(self.configured, fit))


def eligible(seq: Sequence) -> bool:
    """A decode whose next tokens are its logits' first maxima, with nothing else asked of them, of an online request
    at the default rank or more urgent."""
    p = seq.params
    return (seq.priority == PRIORITY_ONLINE and seq.rank <= 0 and p.greedy and not p.logprobs
            and p.repetition_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0 and not p.logit_bias and p.structured_outputs is None
            and seq.grammar is None and (seq.thinking is None or seq.thinking.budget is None)
            and seq.group is None and not seq.adapter_slot and not seq.draft_token_ids
            and len(seq.output_token_ids) >= p.min_tokens)  # the C argmax bans nothing


def plan(max_steps: int, others: bool, plain: list[Sequence], blocks: BlockManager) -> int:
    """The steps this step's plain decodes run (1: a plain step): at most ``max_steps`` (the pacer's), none while
    ``others`` (anything else in the step, waiting or swapped). Slots for the extra positions are reserved best
    effort (unpromised blocks only); every row runs as many steps as the row with the fewest got."""
    if max_steps <= 1 or others or not plain or len(plain) > MAX_ROWS or not all(eligible(s) for s in plain):
        return 1
    got = [blocks.extra_slots(s, max(0, min(max_steps - 1, s.max_output - len(s.output_token_ids) - 1)))
           for s in plain]
    steps = 1 + min(got)
    if steps == 1:
        for s, g in zip(plain, got):
            if g:
                blocks.trim(s)
    return steps

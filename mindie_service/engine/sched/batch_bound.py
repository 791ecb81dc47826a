"""How much batch-job work (PRIORITY_BATCH lines) one step may carry, so that online requests do not wait
behind it (issue #27). Plain Python (no torch).

Two bounds, both ScheduleConfig keys:

- ``batchPrefillTokens``: batch lines' prompt tokens in any one step (their prompts are chunked over steps).
  An online request arrives at any moment and waits for the step in flight: no step may be a long batch
  prefill.
- ``batchTokensBesideOnline``: while an online request waits for admission or is still prefilling, the
  step carries at most this many batch tokens in all (a decoding line counts one, a prompt chunk its
  length): its first token is not computed beside the whole batch. Decoding lines go first, those that ran
  least recently first (so every line progresses), then prompt tokens; at least one token, so batch
  work never stops while online traffic keeps arriving.

Both bounds also hold online requests less urgent than an urgent request seen lately (``live``, engine.sched.
urgent_first.Watch), apart from the batch lines' own: while it is live, their work in a step is at most
batchTokensBesideOnline tokens in all (decodes first, least recently run first, then prompt tokens, at most
batchPrefillTokens), so the step an urgent arrival waits for is about as short as its own. A running decode still
gets a token every few steps (round robin), and a prompt that has waited order.AGING_S is no longer held."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from mindie_service.engine.contract import PRIORITY_ONLINE
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.sequence import Sequence
from mindie_service.engine.sched.chunks import prefilling
from mindie_service.engine.sched.urgent_first import Urgent


@dataclass
class BatchAllowance:
    """One step's allowance of batch-line tokens (``schedule()`` spends it as it picks rows). Online requests
    are never bounded by it."""

    prompt_left: int  # batch prompt tokens still allowed this step
    total_left: int | None = None  # batch tokens of any kind still allowed; None: no online request waits
    decodes: set[str] = field(default_factory=set)  # with total_left: the running batch lines that decode
    live: Urgent | None = None  # online prompts it outranks take at most live_left tokens this step
    live_left: int = 0

    live_rows: bool = False  # the decodes ``live`` outranks run only when chosen (in ``decodes``)

    def runs(self, seq: Sequence) -> bool:
        """Whether ``seq``, running and decoding, decodes this step (False: it skips the step, keeping its
        blocks)."""
        if seq.group is not None or seq.request_id in self.decodes:
            return True
        if seq.priority == PRIORITY_ONLINE:
            return not (self.live_rows and self.live is not None and self.live.outranks_rank(seq))
        return self.total_left is None

    def room(self, seq: Sequence, n: int, prompt: bool = True) -> int:
        """Of ``n`` more tokens ``seq`` would compute this step (prompt tokens, or a decode's draft tokens /
        a resumed line's decode with ``prompt`` False), how many it may."""
        if seq.priority == PRIORITY_ONLINE:
            return min(n, self.live_left) if self._held(seq, prompt) else n
        if prompt:
            n = min(n, self.prompt_left)
        return max(0, n if self.total_left is None else min(n, self.total_left))

    def spend(self, seq: Sequence, n: int, prompt: bool = True) -> None:
        if seq.priority == PRIORITY_ONLINE:
            self.live_left -= n if self._held(seq, prompt) else 0
            return
        if prompt:
            self.prompt_left -= n
        if self.total_left is not None:
            self.total_left -= n

    def _held(self, seq: Sequence, prompt: bool) -> bool:
        return prompt and self.live is not None and self.live.outranks(seq)


def online_pressed(running: Iterable[Sequence], head: Sequence | None) -> bool:
    """An online request waits for admission (``head``: the next to admit; the queues keep online requests
    ahead of batch lines) or is still prefilling."""
    return ((head is not None and head.priority == PRIORITY_ONLINE)
            or any(s.priority == PRIORITY_ONLINE and prefilling(s) for s in running))


def step_allowance(cfg: EngineConfig, running: list[Sequence], pressed: bool, turns: int,
                   live: Urgent | None = None) -> BatchAllowance:
    """This step's allowance; with ``pressed`` (online_pressed), the batch lines that decode are chosen now,
    least recently chosen first (round robin), and given turns ``turns + 1``, ``turns + 2``... ``live``: the
    online requests it outranks are bounded alike, on their own (urgent_first.Watch); batchTokensBesideOnline null:
    no bound on decodes, the prompts still share batchPrefillTokens."""
    prompt = cfg.max_prefill_tokens if cfg.batch_prefill_tokens is None else cfg.batch_prefill_tokens
    bound = cfg.batch_tokens_beside_online
    if bound is None:
        return BatchAllowance(prompt, live=live, live_left=prompt)
    held: list[Sequence] = []  # the less urgent online decodes chosen to run beside live urgent traffic
    live_left = prompt
    if live is not None:
        held = _take_turns([s for s in running if s.priority == PRIORITY_ONLINE and s.group is None
                            and not prefilling(s) and live.outranks_rank(s)], bound, turns)
        live_left = min(prompt, bound - len(held))
    if not pressed:
        return BatchAllowance(prompt, None, {s.request_id for s in held}, live, live_left, live is not None)
    chosen = _take_turns([s for s in running if s.priority != PRIORITY_ONLINE and s.group is None
                          and not prefilling(s)], bound, turns + len(held))
    return BatchAllowance(prompt, bound - len(chosen), {s.request_id for s in held + chosen}, live, live_left,
                          live is not None)


def _take_turns(rows: list[Sequence], bound: int, turns: int) -> list[Sequence]:
    """The first ``bound`` of ``rows``, least recently chosen first (round robin: every row progresses), given turns
    ``turns + 1``, ``turns + 2``...; the others skip this step (their drafts dropped)."""
    rows.sort(key=lambda s: s.batch_turn)  # stable: oldest first among equals
    for i, s in enumerate(rows[:bound]):
        s.batch_turn = turns + 1 + i
    for s in rows[bound:]:
        s.draft_token_ids.clear()
    return rows[:bound]

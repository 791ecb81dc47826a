"""A more urgent request starts at the next step boundary and runs in a short step (engine.sched.order's rank,
within one class). Plain Python (no torch).

While a more urgent request's prompt runs (it is prefilling, or it is the waiting head this step can admit), a less
urgent request of its class gives way (``Urgent.outranks``):

- its running prompt piece waits, so the urgent prefill has the step's token budget; its decode waits too when the
  urgent prompt does run in the step (``Watch.alone``), though never two steps in a row (a stream's gap between
  tokens at most doubles under a flow of urgent prompts): the step is about as short as on an idle server;
- it is not admitted, nor resumed from the swapped queue, in that step: the budget the urgent prompt leaves is
  not spent on the next long prompt, so the step is not a 512-token prefill of someone else's (the step the urgent
  request's first token waits for);
- it is the victim when the urgent head finds no batch slot or too few blocks (``room_victim``): the least
  urgent, newest running request of the class is preempted, at most maxPreemptCount a step (0: never).

The step in flight when an urgent request arrives is kept short as well, while urgent traffic is live: for LIVE_S
after a more urgent online request was last in the engine, less urgent online work takes at most
batchTokensBesideOnline tokens a step in all, its decodes taking turns, then prompt pieces of at most
batchPrefillTokens (``Watch``, spent through engine.sched.batch_bound's allowance), as batch lines do beside online
traffic; the next urgent arrival then waits for a step of that size, not every stream's decode or a maxPrefillTokens
prefill.
Multi-step bursts are cut too: a step with a prompt in it never bursts, and rows less urgent than the default
(rank > 0) never burst (engine.sched.bursts.eligible): an urgent arrival waits for one step in flight, not eight.
No starvation: a request that has waited order.AGING_S since it arrived gives way no more (its decode still takes
turns: a rate, never a wait). Equal ranks never give way: default traffic is scheduled as before."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.contract import PRIORITY_ONLINE
from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.sched.admit_rules import room_for
from mindie_service.engine.sched.chunks import prefilling
from mindie_service.engine.sched.order import AGING_S, urgency
from mindie_service.engine.sequence import Sequence, SeqStatus

LIVE_S = 1.0  # how long after a more urgent request was last seen less urgent prompts still run in short pieces


@dataclass(frozen=True)
class Urgent:
    """One step's most urgent (class, rank) whose prompt runs (``key``; None: no prompt runs), read at ``now``."""

    key: tuple[int, int] | None
    now: float | None = None
    aging_s: float = AGING_S

    def outranks(self, seq: Sequence) -> bool:
        """Whether ``seq`` gives way this step: less urgent within the key's class, and not aged."""
        return (self.outranks_rank(seq)
                and (self.now is None or self.now - seq.arrival < self.aging_s))

    def outranks_rank(self, seq: Sequence) -> bool:
        """Less urgent within the key's class, however long it has waited (a bound on its rate, never a wait)."""
        return self.key is not None and seq.priority == self.key[0] and seq.rank > self.key[1]

    def yields(self, seq: Sequence) -> bool:
        """Whether running ``seq`` (its prompt piece, or its decode) waits this step (a beam group's members stay
        in step)."""
        return seq.group is None and self.outranks(seq)


def urgent_key(cfg: EngineConfig, blocks: BlockManager, running: list[Sequence],
               head: Sequence | None) -> tuple[int, int] | None:
    """The most urgent (class, rank) whose prompt runs this step: a running prefill, or the waiting head when
    there is a slot and blocks to admit it now; None when nothing prefills."""
    keys = [urgency(s) for s in running if prefilling(s)]
    if (head is not None and head.status is SeqStatus.WAITING and len(running) < cfg.max_batch_size
            and room_for(cfg, blocks, head)):
        keys.append(urgency(head))
    return min(keys) if keys else None


def room_victim(cfg: EngineConfig, blocks: BlockManager, running: list[Sequence], head: Sequence,
                by_rank: int, now: float | None) -> Sequence | None:
    """The running request to preempt so that ``head`` (the next to admit) fits, or None: it fits, or nothing
    may go. ``running`` is in urgency order; ``by_rank``: requests already preempted this step for a more urgent
    head. An online head takes a batch-job line's place first (whatever maxPreemptCount says: the line resumes
    later); then a more urgent head takes the least urgent, newest one of its class (not one that waited
    AGING_S), at most maxPreemptCount a step."""
    if len(running) < cfg.max_batch_size and room_for(cfg, blocks, head):
        return None
    if head.priority == PRIORITY_ONLINE:
        batch = [q for q in running if q.priority > PRIORITY_ONLINE]
        if batch:
            return batch[-1]
    if by_rank >= cfg.max_preempt_count:
        return None
    gives_way = Urgent(urgency(head), now)
    victims = [q for q in running if q.group is None and gives_way.outranks(q)]
    # None when even all of them would not free its blocks: their work would be lost for nothing
    held = sum(len(q.block_table) for q in victims) + blocks.num_available_blocks
    return victims[-1] if victims and held >= blocks.blocks_needed(head.num_tokens) else None


@dataclass
class Watch:
    """What the scheduler keeps from step to step: the ranks of the online requests seen in the engine in the last
    LIVE_S (rank -> when last seen), and the decodes that waited out the last step for an urgent prompt."""

    seen: dict[int, float] = field(default_factory=dict)
    live_s: float = LIVE_S
    paused: set[str] = field(default_factory=set)

    def alone(self, urgent: Urgent, decodes: list[Sequence], prefills: list[tuple[Sequence, int]],
              blocks: BlockManager) -> list[Sequence]:
        """The decodes that run beside this step's prompts: none that yields to ``urgent`` when a prompt of its key's
        urgency is in the step (only then: a decode never waits for an urgent request that cannot run yet, a LoRA
        slot or blocks short), but each that waited out the last step. A waiting one keeps the slot for its next
        token; its drafts and their slots are dropped."""
        wait: set[str] = set()
        if any(urgency(s) == urgent.key for s, _ in prefills):
            wait = {s.request_id for s in decodes if urgent.yields(s) and s.request_id not in self.paused}
        self.paused = wait
        for s in decodes:
            if s.request_id in wait and s.draft_token_ids:
                s.draft_token_ids.clear()
                blocks.trim(s)
        return [s for s in decodes if s.request_id not in wait]

    def live(self, running: Iterable[Sequence], head: Sequence | None, now: float | None) -> Urgent | None:
        """Look at the running requests and ``head`` (the next to admit): the most urgent online key still live,
        whose less urgent prompts run in short pieces this step; None without a clock or traffic."""
        if now is None:
            return None
        for s in (*running, *((head,) if head is not None else ())):
            if s.priority == PRIORITY_ONLINE:
                self.seen[s.rank] = now
        for rank in [r for r, t in self.seen.items() if now - t >= self.live_s]:
            del self.seen[rank]
        return Urgent((PRIORITY_ONLINE, min(self.seen)), now) if self.seen else None

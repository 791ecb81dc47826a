"""A request's token state inside the engine (the scheduler and the block manager own it; the runner
sees only the plain ScheduledChunks of engine.step), and the groups of sequences the scheduler runs as
one request (a beam search's beams)."""
from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mindie_service.sampling_params import SamplingParams

if TYPE_CHECKING:  # each feature's per-sequence state, owned by its room
    from mindie_service.engine.sample.grammar_masks import GrammarState
    from mindie_service.engine.output.reasoning import ThinkTrack
    from mindie_service.engine.spec.spec_policy import SeqSpec


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"  # preempted with its K/V copied to the host pool (engine.kv.swap); resumes where it was
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_output: int  # min(max_tokens, maxIterTimes, maxSeqLen - prompt_len)
    seed: int
    cache_key: bytes = b""  # adapter identity + media hashes: folded into every prefix-cache block hash
    adapter_slot: int = 0  # LoRA pool slot (0 = base model)
    priority: int = 0  # engine.contract.PRIORITY_*: online first, batch-job lines after (and preempted first)
    rank: int = 0  # the request's priority within its class, lower first (engine.sched.order)
    batch_turn: int = 0  # its last turn decoding beside more urgent traffic (engine.sched.batch_bound)
    mm_inputs: Any = None
    output_token_ids: list[int] = field(default_factory=list)
    status: SeqStatus = SeqStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = 0  # of those, found in the prefix cache at admission
    num_registered_blocks: int = 0  # leading full blocks already entered in the prefix cache
    block_hashes: list[bytes] = field(default_factory=list)
    num_preemptions: int = 0
    arrival: float = 0.0  # when the scheduler queued it (its clock): maxQueueDelayMicroseconds counts from here
    scheduled_at: float | None = None  # when the scheduler first admitted it (its clock): the queue time's end
    host_blocks: list[int] = field(default_factory=list)  # while SWAPPED: host-pool blocks holding its K/V
    finish_reason: str | None = None
    aborted: bool = False
    session_id: str | None = None  # kept for continuation under this key when it finishes (engine.sessions.session_store)
    group: SequenceGroup | None = None  # the group this sequence is a member of (a beam); None: on its own
    # Speculative decoding (engine.spec.speculator): this step's draft tokens, proposed before scheduling (the
    # scheduler keeps as many as its budget and blocks allow), and the proposer's per-sequence state.
    draft_token_ids: list[int] = field(default_factory=list)
    spec: SeqSpec | None = None
    grammar: GrammarState | None = None  # structured output: its matcher and cached mask; None: unconstrained
    thinking: ThinkTrack | None = None  # the reasoning split's engine view (engine.output.reasoning); None: no split

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_at(self, i: int) -> int:
        p = len(self.prompt_token_ids)
        return self.prompt_token_ids[i] if i < p else self.output_token_ids[i - p]

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED


@dataclass(eq=False)
class SequenceGroup:
    """Sequences of one request that the scheduler runs together: a beam search's beams. They are admitted,
    counted against maxBatchSize (``width`` rows: the most members the group runs at once), preempted and
    restarted as one. ``root`` carries the request as added (the client's id, prompt, parameters, caps); it
    is never scheduled itself. Members get ids of their own (the step contract keys rows by request id);
    what a member belongs to is its ``group``, never read back from its id."""

    root: Sequence
    width: int
    members: list[Sequence] = field(default_factory=list)  # running, in order (beam order)
    restarts: int = 0  # times the scheduler restarted it from the prompt
    _next_member: int = 0

    @property
    def request_id(self) -> str:
        return self.root.request_id

    def new_member(self, output_token_ids: list[int]) -> Sequence:
        """A new member: the root's prompt and request, with ``output_token_ids`` already generated."""
        r = self.root
        seq = Sequence(f"{r.request_id}#b{self._next_member}", list(r.prompt_token_ids), r.params, r.max_output,
                       r.seed, cache_key=r.cache_key, output_token_ids=list(output_token_ids))
        self._next_member += 1
        seq.group = self
        return seq

    def restart(self) -> Sequence:
        """(Re)start from the prompt: one member holding it replaces every member."""
        seq = self.new_member([])
        self.members = [seq]
        return seq


def batch_rows(running: Iterable[Sequence]) -> int:
    """Rows of the running batch: sequences on their own, plus each running group's width (the members it
    may fork up to)."""
    widths: dict[int, int] = {}
    alone = 0
    for s in running:
        if s.group is None:
            alone += 1
        else:
            widths[id(s.group)] = s.group.width
    return alone + sum(widths.values())

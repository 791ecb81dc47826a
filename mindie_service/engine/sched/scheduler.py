"""Continuous batching over the paged KV pool, with chunked prefill. Plain Python (no torch).

Each step every running request computes its next tokens in one forward pass: one token for a request that is decoding,
the next piece of its prompt for one that is still prefilling. Prompt tokens are bounded per step by
``maxPrefillTokens`` (the step's token budget, vLLM's max_num_batched_tokens; the running requests' decode tokens ride
along), so a long prompt is computed over several steps while the others keep streaming, instead of stalling them all
for its whole prefill (a more urgent one's prompt first, in a short step: engine.sched.urgent_first). New requests are
admitted by urgency (engine.sched.order), then first come first served (the head of the queue is never skipped) within
maxBatchSize, maxPrefillBatchSize, free blocks and the LoRA pool's slots. When blocks run out, or a more urgent head
finds no room, the least urgent, newest running request is preempted: its K/V is copied to the host pool when there is
room (ModelConfig.cpuMemSize, engine.kv.swap; it waits in the swapped queue, ahead of new requests of its priority,
and resumes where it was), else its blocks are freed and it is recomputed later from its prompt and its output.

maxPreemptCount bounds the preemptions for want of blocks in one round: a decode still without a block after the cap
waits a step (nothing new is admitted meanwhile); only when nothing at all would run does the oldest such decode preempt
past the cap, so the engine always progresses. 0 turns preemption off: each request is admitted only with blocks
reserved for its prompt plus its maximum output (a beam search for all its beams), so no running request ever lacks a
block. A more urgent head's preemptions have a cap of their own (maxPreemptCount a step; 0: none). Two are not
scheduling decisions and have none: an online request taking a batch-job line's slot or blocks (a priority rule, on even
with 0: the line has nothing sent that it could lose and resumes later), and a beam search restarting because a fork
found no block (engine.sample.beam). ``schedule()`` returns plain data (engine.step); ``update()`` applies a step."""
from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from operator import attrgetter
from typing import Protocol

from mindie_service.engine.sched.admit_rules import queue_delay, reservation_blocks
from mindie_service.engine.sched.batch_bound import BatchAllowance, online_pressed, step_allowance
from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.sched import bursts
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.sequence import Sequence, SequenceGroup, SeqStatus, batch_rows
from mindie_service.engine.sessions.session_store import SessionStore
from mindie_service.engine.sched.chunks import chunk as _chunk, prefilling as _prefilling, spec_chunk as _spec_chunk  # noqa: E501
from mindie_service.engine.step import SchedulerOutput
from mindie_service.engine.kv.swap import HostBlockPool, swap_in, swap_out
from mindie_service.engine.sched.order import promote_aged, urgency
from mindie_service.engine.sched.urgent_first import Urgent, Watch, room_victim, urgent_key

logger = logging.getLogger(__name__)


class AdapterSlots(Protocol):
    """Pins a request's LoRA adapter in a pool slot while it runs (see mindie_service.lora)."""

    def acquire(self, request_id: str) -> int | None: ...  # its slot (0: base model); None: none free, wait

    def release(self, request_id: str, done: bool) -> None: ...  # preempted (done=False) or finished


class Scheduler:
    def __init__(self, cfg: EngineConfig, blocks: BlockManager, adapters: AdapterSlots | None = None,
                 sessions: SessionStore | None = None, host: HostBlockPool | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        # clock (seconds, e.g. time.monotonic): the engine's, for maxQueueDelayMicroseconds; None = never hold
        self.cfg, self.blocks, self.adapters, self.sessions, self.clock = cfg, blocks, adapters, sessions, clock
        self.host = host if host is not None and host.num_blocks > 0 else None  # None: preempting recomputes
        self.waiting: deque[Sequence] = deque()
        self.swapped: deque[Sequence] = deque()  # K/V in the host pool; resume ahead of waiting (same priority)
        self.running: list[Sequence] = []
        self.seqs: dict[str, Sequence] = {}
        self.batch_turns = 0  # turns batch lines took beside a waiting online request (engine.sched.batch_bound)
        self.watch = Watch()  # online ranks seen lately: less urgent prompts run in short pieces (sched.urgent_first)
        self.decode_steps = 1  # a burst's steps (engine.sched.bursts): the engine's pacer sets it after each decode step
        self.num_preemptions = self.num_swap_outs = self.num_swap_ins = 0  # swaps: sequences (not blocks) out, and back

    # ------------------------------------------------------------ queue
    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        seq.arrival = self.clock() if self.clock is not None else 0.0
        self.seqs[seq.request_id] = seq
        self._enqueue(seq)

    def _enqueue(self, seq: Sequence, front: bool = False, queue: deque[Sequence] | None = None) -> None:
        """In urgency order (engine.sched.order: class, then request priority); within one first come, first
        served, and a preempted request goes back to the front of its own."""
        w = self.waiting if queue is None else queue
        key = urgency(seq)
        if not front and (not w or urgency(w[-1]) <= key):
            w.append(seq)
            return
        at = next((k for k, q in enumerate(w) if (urgency(q) >= key if front else urgency(q) > key)), len(w))
        w.insert(at, seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def get(self, request_id: str) -> Sequence | None:
        return self.seqs.get(request_id)

    def finish(self, seq: Sequence, reason: str | None = None) -> None:
        """Drop a sequence (finished, or aborted with ``reason`` None) and free its blocks."""
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SeqStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        elif seq.status is SeqStatus.SWAPPED:
            self.swapped.remove(seq)
            if self.host is not None:  # its swap-out ran with the step that decided it: nothing reads them
                self.host.free(seq.host_blocks)
            seq.host_blocks = []
        if reason is not None and seq.session_id is not None and self.sessions is not None:
            self.sessions.keep(seq)  # pins its cached blocks before its own references go
        self.blocks.free_seq(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        self.seqs.pop(seq.request_id, None)
        if self.adapters is not None:
            self.adapters.release(seq.request_id, done=True)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        if seq.group is not None:
            out.preempted.append(self.restart_group(seq.group).request_id)
            return
        self.running.remove(seq)
        seq.draft_token_ids.clear()
        swapped = self._swap_out(seq, out)
        if self.adapters is not None:
            self.adapters.release(seq.request_id, done=False)
        seq.adapter_slot = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        if swapped:
            seq.status = SeqStatus.SWAPPED
            self._enqueue(seq, front=True, queue=self.swapped)
        else:
            seq.status = SeqStatus.WAITING
            self._enqueue(seq, front=True)
        out.preempted.append(seq.request_id)
        logger.debug("preempted %s (%d tokens, %s)", seq.request_id, seq.num_tokens,
                     "swapped out" if swapped else "to recompute")

    def _swap_out(self, seq: Sequence, out: SchedulerOutput) -> bool:
        """Free ``seq``'s device blocks, first copying their K/V to the host pool when it has room and
        ``seq`` is decoding (a prompt cut short is cheaper to recompute)."""
        if self.host is None or _prefilling(seq) or not swap_out(self.blocks, self.host, seq, out):
            self.blocks.free_seq(seq)
            return False
        self.num_swap_outs += 1
        return True

    def _swap_in(self, seq: Sequence, out: SchedulerOutput) -> bool:
        assert self.host is not None
        reserve = self._reserve(seq)
        if not swap_in(self.blocks, self.host, seq, out, reserve):
            wanted = max(self.blocks.blocks_needed(seq.num_tokens), reserve) + self.blocks.reserved
            if not (self.sessions is not None and self.sessions.release(wanted)
                    and swap_in(self.blocks, self.host, seq, out, reserve)):
                return False
        self.num_swap_ins += 1
        return True

    # ------------------------------------------------------------ one step
    def schedule(self) -> SchedulerOutput:
        if self.host is not None:
            self.host.step_done()  # the previous step's copies ran: its swap-ins' host blocks are free
        now = self.clock() if self.clock is not None else None
        promote_aged(self.waiting, now)  # no request starves behind more urgent ones (engine.sched.order)
        hold = queue_delay(self.cfg, self.waiting, bool(self.running or self.swapped), now)
        if hold > 0:
            return SchedulerOutput(hold_s=hold)
        out = SchedulerOutput()
        decodes: list[Sequence] = []
        prefills: list[tuple[Sequence, int]] = []  # (sequence, tokens this step)
        budget = self.cfg.max_prefill_tokens
        # Most urgent first (stable: oldest first within each): the last blocks go to online traffic, preemption
        self.running.sort(key=urgency)  # takes the newest batch line, else the least urgent request, first
        yielded = self._make_room(out, now)
        head = self._next_to_admit()
        live = self.watch.live(self.running, head, now)
        allow = step_allowance(self.cfg, self.running, online_pressed(self.running, head), self.batch_turns, live)
        urgent = Urgent(urgent_key(self.cfg, self.blocks, self.running, head), now)  # engine.sched.urgent_first
        self.batch_turns += len(allow.decodes)
        # Running requests, most urgent first: decodes need a slot for their next token (preempt from the newest end
        # when the pool is dry, at most maxPreemptCount); unfinished prompts take their next piece of the budget.
        cap = self.cfg.max_preempt_count
        stalled: list[Sequence] = []  # decodes without a block once the cap is reached: they wait a step
        for seq in list(self.running):
            if seq.status is not SeqStatus.RUNNING:
                continue  # preempted this step with its beam group
            if _prefilling(seq):  # its blocks were allocated at admission (a forked beam's at the fork)
                budget -= 0 if urgent.yields(seq) else self._prefill_piece(seq, budget, allow, prefills)
                continue
            if not allow.runs(seq):  # a batch line skips this step: an online request waits (engine.sched.batch_bound)
                continue
            if not self._make_slot(seq, out, cap - (len(out.preempted) - yielded)):
                if seq.status is SeqStatus.RUNNING:
                    stalled.append(seq)
                continue  # stalled, or preempted itself (a beam group's beams may still follow it)
            budget -= self._keep_drafts(seq, budget, allow)
            decodes.append(seq)
        decodes = [s for s in decodes if s.status is SeqStatus.RUNNING]  # a preempted beam group's picked beams
        prefills = [(s, n) for s, n in prefills if s.status is SeqStatus.RUNNING]
        stalled = [s for s in stalled if s.status is SeqStatus.RUNNING]
        if stalled and not decodes and not prefills:
            # Nothing would run: the oldest stalled decode preempts past the cap (it may end up preempting
            # itself; then the next round runs what is left), so the engine never stands still.
            if self._make_slot(stalled[0], out, len(self.running)):
                decodes.append(stalled[0])
        if len(out.preempted) == yielded and not stalled:  # no request short of blocks: admit
            self._admit(out, decodes, prefills, budget, allow, urgent)
        decodes = self.watch.alone(urgent, decodes, prefills, self.blocks)  # an urgent prompt's step: others wait
        if self.adapters is not None:  # one LoRA segment per adapter (stable: order kept within each)
            decodes.sort(key=attrgetter("adapter_slot"))
            prefills.sort(key=lambda p: p[0].adapter_slot)
        plain = [s for s in decodes if not s.draft_token_ids]
        spec = [s for s in decodes if s.draft_token_ids]  # verify rows: several tokens, after the plain decodes
        steps = bursts.plan(  # a few greedy decodes alone: several steps a call
            self.decode_steps, bool(self.waiting or self.swapped or spec or prefills), plain, self.blocks)
        out.chunks = ([_chunk(s, 1, steps) for s in plain] + [_spec_chunk(s) for s in spec]
                      + [_chunk(s, n) for s, n in prefills])
        out.num_decodes = len(plain)
        return out

    def _prefill_piece(self, seq: Sequence, budget: int, allow: BatchAllowance,
                       prefills: list[tuple[Sequence, int]]) -> int:
        """The next piece of running ``seq``'s prompt, within the budget and batch allowance: the tokens taken."""
        if seq.group is not None:  # a beam recomputes its partly filled block whole: beams stay in step
            prefills.append((seq, seq.num_tokens - seq.num_computed_tokens))
            return 0
        n = allow.room(seq, min(seq.num_tokens - seq.num_computed_tokens, budget))
        if n <= 0 or len(prefills) >= self.cfg.max_prefill_batch_size:
            return 0
        prefills.append((seq, n))
        allow.spend(seq, n)
        return n

    # ------------------------------------------------------------ groups (a beam search's beams, engine.sample.beam)
    def fork(self, parent: Sequence, child: Sequence) -> bool:
        """Start ``child``, a new member of ``parent``'s group forked from it (blocks shared copy-on-write);
        False when the pool is short even after releasing kept sessions' blocks."""
        ok = self.blocks.fork(parent, child)
        if not ok and self.sessions is not None and self.sessions.release(self.blocks.blocks_needed(child.num_tokens)):
            ok = self.blocks.fork(parent, child)
        if ok:
            child.status = SeqStatus.RUNNING
            child.adapter_slot = parent.adapter_slot
            self.seqs[child.request_id] = child
            self.running.append(child)
        return ok

    def restart_group(self, group: SequenceGroup) -> Sequence:
        """Drop every member of ``group`` and queue it again from the prompt, at the front: nothing has been
        sent (a beam search sends its chosen beam at the end) and the search is deterministic."""
        for b in group.members:
            if b.status is not SeqStatus.FINISHED:
                self.finish(b)
        seq = group.restart()
        group.restarts += 1
        self.num_preemptions += 1
        seq.status = SeqStatus.WAITING
        self.seqs[seq.request_id] = seq
        self._enqueue(seq, front=True)
        logger.debug("group %s restarts (%d)", group.request_id, group.restarts)
        return seq

    def _make_room(self, out: SchedulerOutput, now: float | None) -> int:
        """The head of the queue that finds no batch slot or too few free blocks preempts, until it fits, batch-job
        lines when it is online (batch work only fills what online traffic leaves), then less urgent requests of
        its class (engine.sched.urgent_first.room_victim). Returns how many were preempted."""
        n = by_rank = 0
        while (head := self._next_to_admit()) is not None:
            victim = room_victim(self.cfg, self.blocks, self.running, head, by_rank, now)
            if victim is None:
                break
            by_rank += victim.priority == head.priority
            self._preempt(victim, out)
            n += 1
        return n

    def _make_slot(self, seq: Sequence, out: SchedulerOutput, preempts_left: int) -> bool:
        """A slot for decoding ``seq``'s next token, preempting at most ``preempts_left`` requests from the
        newest end; False when it stays without one (or was preempted itself)."""
        while not self.blocks.can_append(seq):
            if self.sessions is not None and self.sessions.release(1):
                continue  # kept sessions' blocks go before running requests are preempted
            if preempts_left <= 0:
                return False
            victim = self.running[-1]  # the newest batch-job line, else the newest request
            self._preempt(victim, out)
            preempts_left -= 1
            if seq.status is not SeqStatus.RUNNING:
                return False
        self.blocks.append_slot(seq)
        return True

    def _keep_drafts(self, seq: Sequence, budget: int, allow: BatchAllowance) -> int:
        """Keep as many of ``seq``'s draft tokens (engine.spec.speculator) as the step's token budget, batch allowance,
        output cap (room for the token after them) and unpromised free blocks allow (drafts never preempt)."""
        drafts = seq.draft_token_ids
        room = min(allow.room(seq, len(drafts), prompt=False), max(0, budget),
                   seq.max_output - len(seq.output_token_ids) - 1)
        kept = self.blocks.extra_slots(seq, room) if room > 0 else 0
        del drafts[kept:]
        allow.spend(seq, kept, prompt=False)
        return kept

    def _next_to_admit(self) -> Sequence | None:
        """The swapped head before the waiting head of the same or a lower priority (vLLM's order)."""
        if self.swapped and (not self.waiting or urgency(self.swapped[0]) <= urgency(self.waiting[0])):
            return self.swapped[0]
        return self.waiting[0] if self.waiting else None

    def _admit(self, out: SchedulerOutput, decodes: list[Sequence], prefills: list[tuple[Sequence, int]],
               budget: int, allow: BatchAllowance, urgent: Urgent) -> None:
        """Resume swapped requests (as decodes) and admit waiting ones, first come first served within a
        priority, while the budget, the batch allowance and the limits allow; none that gives way to a more
        urgent prompt in this step (``urgent``: the step stays short)."""
        while (seq := self._next_to_admit()) is not None and not urgent.outranks(seq):
            if seq.status is SeqStatus.SWAPPED:
                if (batch_rows(self.running) >= self.cfg.max_batch_size or allow.room(seq, 1, prompt=False) < 1
                        or not self._resume(seq, out)):
                    break
                allow.spend(seq, 1, prompt=False)
                decodes.append(seq)
                continue
            if allow.room(seq, budget) <= 0:
                break
            rows = batch_rows(self.running)
            if rows >= self.cfg.max_batch_size or len(prefills) >= self.cfg.max_prefill_batch_size:
                break
            if seq.group is not None and rows + seq.group.width > self.cfg.max_batch_size:
                break  # its members will count against maxBatchSize

            # Distinct adapters are bounded by the LoRA pool's slots: the head waits for one to free up.
            if self.adapters is not None:
                slot = self.adapters.acquire(seq.request_id)
                if slot is None:
                    break
                seq.adapter_slot = slot
            if not self._allocate(seq):
                if self.adapters is not None:
                    self.adapters.release(seq.request_id, done=False)
                    seq.adapter_slot = 0
                break
            n = allow.room(seq, min(seq.num_tokens - seq.num_computed_tokens, budget))
            budget -= n
            allow.spend(seq, n)
            self.waiting.popleft()
            seq.status, seq.scheduled_at = SeqStatus.RUNNING, seq.scheduled_at or (self.clock() if self.clock else 0.0)
            self.running.append(seq)
            prefills.append((seq, n))

    def _resume(self, seq: Sequence, out: SchedulerOutput) -> bool:
        """Swap ``seq`` back in (its LoRA slot first); it decodes this step."""
        if self.adapters is not None:
            slot = self.adapters.acquire(seq.request_id)
            if slot is None:
                return False
            seq.adapter_slot = slot
        if not self._swap_in(seq, out):
            if self.adapters is not None:
                self.adapters.release(seq.request_id, done=False)
                seq.adapter_slot = 0
            return False
        self.swapped.popleft()
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)
        return True

    def _reserve(self, seq: Sequence) -> int:
        return reservation_blocks(self.cfg, seq, self.blocks.blocks_needed, self.blocks.num_blocks)

    def _allocate(self, seq: Sequence) -> bool:
        """Blocks for a waiting request; kept sessions' pinned blocks are released (LRU) when short."""
        use_cache = not seq.params.prompt_logprobs
        reserve = self._reserve(seq)
        if self.blocks.allocate(seq, use_prefix_cache=use_cache, reserve=reserve):
            return True
        wanted = max(self.blocks.blocks_needed(seq.num_tokens), reserve) + self.blocks.reserved
        return (self.sessions is not None and self.sessions.release(wanted)
                and self.blocks.allocate(seq, use_prefix_cache=use_cache, reserve=reserve))

    def update(self, out: SchedulerOutput, sampled: Mapping[str, int | list[int]],
               finished: Mapping[str, str]) -> None:
        """Apply a step: each chunk's K/V is now computed (its full blocks enter the prefix cache), each
        sampled token (or accepted run of a verify chunk) is appended, and the requests in ``finished``
        (request id -> reason) end.
        Chunks of requests aborted or failed during the step are skipped."""
        for c in out.chunks:
            seq = self.seqs.get(c.request_id)
            if seq is None or seq.status is not SeqStatus.RUNNING:
                continue
            got = sampled.get(c.request_id)
            run = [] if got is None else [got] if isinstance(got, int) else list(got)
            # A verify chunk's accepted drafts stay computed (run = accepted + 1), a multi-step chunk's kept run:
            # the slots past it are trimmed.
            runs = bool(c.num_draft) or c.steps > 1
            seq.num_computed_tokens = c.start + len(run) if runs else c.end
            seq.draft_token_ids.clear()
            seq.output_token_ids.extend(run)  # first: a run's computed positions hold its tokens (block hashes)
            self.blocks.register_computed(seq)
            if runs:
                self.blocks.trim(seq)
            reason = finished.get(c.request_id)
            if reason is not None:
                self.finish(seq, reason)

"""maxPreemptCount on the real scheduler with a tiny pool (no model): at most that many preemptions for
want of blocks per round, stalled decodes wait without deadlock, and 0 turns preemption off by admitting
each request with blocks reserved for its prompt plus its maximum output."""
from __future__ import annotations

from dataclasses import replace

from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.sched.scheduler import Scheduler
from mindie_service.engine.sequence import Sequence, SeqStatus
from mindie_service.engine.step import SchedulerOutput
from mindie_service.engine.contract import PRIORITY_BATCH
from mindie_service.sampling_params import SamplingParams

BS = 4


def _sched(blocks: int, cap: int, max_batch_size: int = 8) -> Scheduler:
    cfg = EngineConfig(model="x", cache_block_size=BS, max_seq_len=256, max_input_token_len=64,
                       max_prefill_tokens=256, max_batch_size=max_batch_size,
                       max_prefill_batch_size=max_batch_size, max_preempt_count=cap)
    return Scheduler(cfg, BlockManager(blocks, BS, enable_prefix_caching=False))


def _seq(i: int, n: int = 8, max_output: int = 32, batch: bool = False) -> Sequence:
    return Sequence(f"r{i}", [i + 10] * n, SamplingParams(max_tokens=max_output), max_output, seed=0,
                    priority=PRIORITY_BATCH if batch else 0)


def _step(s: Scheduler) -> SchedulerOutput:
    """schedule + update, a request finishing at its maximum output (as the output processor would)."""
    out = s.schedule()
    done = {c.request_id: "length" for c in out.sampled
            if len(s.get(c.request_id).output_token_ids) + 1 >= s.get(c.request_id).max_output}
    s.update(out, {c.request_id: 1 for c in out.sampled}, done)
    return out


def _drain(s: Scheduler, blocks: int) -> None:
    for _ in range(500):
        if not s.has_work():
            break
        _step(s)
    assert not s.has_work() and s.blocks.num_free_blocks == blocks and s.blocks.reserved == 0


def _ids(chunks) -> list[str]:
    return [c.request_id for c in chunks]


def _four_full(cap: int) -> Scheduler:
    """Four requests whose 8-token prompts fill the 8-block pool: their first decodes all need a block."""
    s = _sched(blocks=8, cap=cap)
    for i in range(4):
        s.add(_seq(i, max_output=24))  # the engine caps output to what the pool holds (add_request)
    out = _step(s)
    assert len(out.prefills) == 4 and s.blocks.num_free_blocks == 0
    return s


def test_cap_bounds_preemptions_in_a_round_and_stalled_decodes_wait():
    s = _four_full(cap=1)
    s.add(_seq(9, n=2))  # waits: nothing is admitted while a running request lacks a block
    out = _step(s)
    # r0 preempts r3 (the cap) and takes one of its blocks, r1 the other; r2 finds none and waits.
    assert out.preempted == ["r3"] and _ids(out.decodes) == ["r0", "r1"] and not out.prefills
    r2 = s.get("r2")
    assert r2.status is SeqStatus.RUNNING and r2.num_computed_tokens == 8 and len(r2.output_token_ids) == 1
    assert _ids(s.waiting) == ["r3", "r9"]
    out = _step(s)  # a new round, a new allowance: r2 now preempts (itself, the newest) and the others go on
    assert out.preempted == ["r2"] and _ids(out.decodes) == ["r0", "r1"]


def test_without_a_cap_one_round_preempts_as_many_as_needed():
    s = _four_full(cap=8)
    out = _step(s)
    assert out.preempted == ["r3", "r2"] and _ids(out.decodes) == ["r0", "r1"]
    _drain(s, 8)


def test_a_round_where_nothing_would_run_preempts_past_the_cap():
    # A decode short of a block with preemption off can only come from a wrong reservation; even then the
    # engine must not stand still: the oldest such decode preempts past the cap.
    s = _four_full(cap=8)
    s.cfg = replace(s.cfg, max_preempt_count=0)
    out = _step(s)
    assert out.preempted == ["r3"] and _ids(out.decodes) == ["r0"]
    _drain(s, 8)


def test_zero_admits_only_with_blocks_reserved_for_the_whole_output():
    s = _sched(blocks=8, cap=0)
    for i in range(4):
        s.add(_seq(i, n=8, max_output=8))  # 8 + 8 tokens: 4 blocks reserved each
    out = _step(s)
    assert _ids(out.prefills) == ["r0", "r1"] and _ids(s.waiting) == ["r2", "r3"]
    assert s.blocks.num_free_blocks == 4 and s.blocks.reserved == 4 and s.blocks.num_available_blocks == 0
    steps = 0
    while s.has_work():
        running = [q.request_id for q in s.running if q.num_computed_tokens >= q.num_prompt_tokens]
        out = _step(s)
        assert not out.preempted and set(_ids(out.decodes)) >= set(running)  # no decode ever stalls
        steps += 1
        assert steps < 100
    assert s.num_preemptions == 0 and s.blocks.reserved == 0 and s.blocks.num_free_blocks == 8


def test_zero_reservation_is_released_when_a_request_is_aborted():
    s = _sched(blocks=8, cap=0)
    a, b = _seq(0, n=8, max_output=8), _seq(1, n=8, max_output=24)  # 4 and 8 blocks
    s.add(a)
    s.add(b)
    _step(s)
    assert s.running == [a] and s.blocks.reserved == 2  # b waits: it needs the whole pool
    s.finish(a)  # aborted
    assert s.blocks.reserved == 0 and s.blocks.num_free_blocks == 8
    _step(s)
    assert s.running == [b] and s.blocks.reserved == 6


def test_online_request_preempts_batch_lines_past_the_cap_and_with_zero():
    for cap in (0, 1):
        s = _sched(blocks=6, cap=cap)
        s.add(_seq(0, n=8, max_output=4, batch=True))
        s.add(_seq(1, n=8, max_output=4, batch=True))
        out = _step(s)
        assert len(out.prefills) == 2
        s.add(_seq(2, n=20, max_output=1))  # online, 5 blocks: both batch lines make room
        out = _step(s)
        assert out.preempted == ["r1", "r0"] and _ids(out.prefills) == ["r2"], cap

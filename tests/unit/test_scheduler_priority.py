"""Request priority (EngineRequest.rank, vLLM's convention: lower first) in the real scheduler on hand-made
steps: the waiting queue orders by (class, rank, arrival), a preempted request goes back to the front of its own
rank, and preemption takes the least urgent (then newest) running request first."""
from __future__ import annotations

from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.contract import PRIORITY_BATCH
from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.sched.scheduler import Scheduler
from mindie_service.engine.sequence import Sequence, SeqStatus
from mindie_service.sampling_params import SamplingParams


def _sched(blocks: int = 64, **kw) -> Scheduler:
    cfg = EngineConfig(model="x", cache_block_size=4, max_seq_len=256, max_input_token_len=64, max_prefill_tokens=256,
                       max_preempt_count=kw.get("max_batch_size", 8), **kw)
    return Scheduler(cfg, BlockManager(blocks, 4, enable_prefix_caching=False))


def _seq(i: int, rank: int = 0, n: int = 4, priority: int = 0) -> Sequence:
    return Sequence(f"r{i}", [i + 10] * n, SamplingParams(max_tokens=8), 8, seed=0, rank=rank, priority=priority)


def _step(s: Scheduler):
    out = s.schedule()
    s.update(out, {c.request_id: 1 for c in out.sampled}, {})
    return out


def test_waiting_queue_orders_by_rank_then_arrival_and_online_before_batch():
    s = _sched()
    for seq in (_seq(0), _seq(1, rank=2), _seq(2, rank=-1), _seq(3, priority=PRIORITY_BATCH, rank=-4),
                _seq(4, rank=-1), _seq(5)):
        s.add(seq)
    assert [q.request_id for q in s.waiting] == ["r2", "r4", "r0", "r5", "r1", "r3"]


def test_a_more_urgent_request_is_admitted_first_when_one_slot_frees():
    s = _sched(max_batch_size=1, max_prefill_batch_size=1)
    s.add(_seq(0))
    _step(s)  # r0 runs
    s.add(_seq(1))
    s.add(_seq(2, rank=-3))  # arrives later, more urgent
    s.finish(s.running[0])
    assert [c.request_id for c in _step(s).prefills] == ["r2"]


def test_preemption_takes_the_least_urgent_running_request_first():
    s = _sched(blocks=4, max_batch_size=4, max_prefill_batch_size=4)
    low, high = _seq(0, rank=3), _seq(1, rank=-2)
    s.add(low)
    _step(s)  # the low one runs first: age alone would make the high one (the newest) the victim
    s.add(high)
    for _ in range(10):  # until the pool runs dry (4 blocks, two growing sequences)
        out = _step(s)
        if out.preempted:
            break
    assert out.preempted == ["r0"] and low.status is SeqStatus.WAITING
    assert [c.request_id for c in out.decodes] == ["r1"]


def test_a_preempted_request_waits_ahead_of_its_rank_but_behind_more_urgent_ones():
    s = _sched()
    s.add(_seq(0, rank=1))
    s.add(_seq(1, rank=-1))
    back = _seq(2, rank=1)
    s._enqueue(back, front=True)  # as _preempt puts a preempted request back
    assert [q.request_id for q in s.waiting] == ["r1", "r2", "r0"]


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _clocked(clock: _Clock) -> Scheduler:
    cfg = EngineConfig(model="x", cache_block_size=4, max_seq_len=256, max_input_token_len=64, max_prefill_tokens=256,
                       max_batch_size=1, max_prefill_batch_size=1, max_queue_delay_microseconds=0)
    return Scheduler(cfg, BlockManager(64, 4, enable_prefix_caching=False), clock=clock)


def test_no_request_starves_behind_a_flow_of_more_urgent_ones():
    from mindie_service.engine.sched.order import AGING_S

    clock = _Clock()
    s = _clocked(clock)
    s.add(_seq(0))
    _step(s)  # r0 holds the only slot
    s.add(_seq(1, rank=2))  # the least urgent, first to wait
    clock.t = AGING_S / 2
    s.add(_seq(2, rank=-1))
    s.finish(s.running[0])
    assert [c.request_id for c in _step(s).prefills] == ["r2"]  # not aged yet: the urgent one first
    clock.t = AGING_S
    s.add(_seq(3, rank=-1))  # still more urgent work arriving
    s.finish(s.running[0])
    assert [c.request_id for c in _step(s).prefills] == ["r1"]  # waited AGING_S: served first


def test_equal_ranks_are_first_come_first_served_whatever_the_wait():
    from mindie_service.engine.sched.order import AGING_S

    clock = _Clock()
    s = _clocked(clock)
    for i in range(3):
        s.add(_seq(i))
    clock.t = 3 * AGING_S
    _step(s)
    assert [q.request_id for q in s.waiting] == ["r1", "r2"]


def _chunked(clock: _Clock | None = None) -> Scheduler:
    """A 16-token step budget: a 48-token prompt takes three steps."""
    cfg = EngineConfig(model="x", cache_block_size=4, max_seq_len=256, max_input_token_len=64, max_prefill_tokens=16,
                       max_batch_size=4, max_prefill_batch_size=4, max_queue_delay_microseconds=0)
    return Scheduler(cfg, BlockManager(64, 4, enable_prefix_caching=False), clock=clock)


def _pieces(out) -> dict[str, int]:
    return {c.request_id: c.end - c.start for c in out.prefills}


def test_a_more_urgent_prompt_takes_the_step_from_less_urgent_ones():
    s = _chunked()
    s.add(_seq(0, rank=2, n=48))
    assert _pieces(_step(s)) == {"r0": 16}  # the low one's prompt, a piece a step
    s.add(_seq(1, rank=-1, n=24))  # an urgent one arrives: it gets the whole budget, r0's piece waits
    assert _pieces(_step(s)) == {"r1": 16}
    assert _pieces(_step(s)) == {"r1": 8}  # still prefilling: r0 still waits (the leftover budget unused)
    assert _pieces(_step(s)) == {"r0": 16}  # r1 decodes now; r0 goes on
    s2 = _chunked()
    s2.add(_seq(0, n=48))
    _step(s2)
    s2.add(_seq(1, n=24))  # equal ranks: shared as before, first come first
    assert _pieces(_step(s2)) == {"r0": 16}


def test_a_prompt_that_waited_aging_s_no_longer_yields():
    from mindie_service.engine.sched.order import AGING_S

    clock = _Clock()
    s = _chunked(clock)
    s.add(_seq(0, rank=2, n=48))
    _step(s)
    clock.t = AGING_S
    s.add(_seq(1, rank=-1, n=24))
    assert _pieces(_step(s)) == {"r0": 16}  # aged: its piece goes first (running order), r1 waits for budget

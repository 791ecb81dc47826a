"""The real scheduler on hand-made steps (no model): MindIE's limits and preemption."""
from __future__ import annotations

from mindie_service.engine.block_manager import BlockManager
from mindie_service.engine.config import EngineConfig
from mindie_service.engine.scheduler import Scheduler
from mindie_service.engine.sequence import Sequence, SeqStatus
from mindie_service.sampling_params import SamplingParams


def _sched(blocks: int = 64, bs: int = 4, **kw) -> Scheduler:
    cfg = EngineConfig(model="x", cache_block_size=bs, max_seq_len=256, max_input_token_len=64,
                       max_prefill_tokens=kw.pop("max_prefill_tokens", 256), **kw)
    return Scheduler(cfg, BlockManager(blocks, bs, enable_prefix_caching=False))


def _seq(i: int, n: int = 6) -> Sequence:
    return Sequence(f"r{i}", [i + 10] * n, SamplingParams(max_tokens=8), 8, seed=0)


def _finish_step(sched, out, token: int = 1) -> None:
    """What the engine does after a step: mark K/V computed, append one sampled token."""
    for s in out.seqs:
        s.num_computed_tokens = s.num_tokens
        s.output_token_ids.append(token)


def test_prefill_batch_is_bounded_by_max_prefill_batch_size():
    s = _sched(max_batch_size=8, max_prefill_batch_size=3)
    for i in range(5):
        s.add(_seq(i))
    out = s.schedule()
    assert len(out.prefills) == 3 and len(s.waiting) == 2


def test_prefill_batch_is_bounded_by_max_prefill_tokens():
    s = _sched(max_batch_size=8, max_prefill_batch_size=8, max_prefill_tokens=64)
    for i in range(5):
        s.add(_seq(i, n=30))
    out = s.schedule()
    assert [q.request_id for q in out.prefills] == ["r0", "r1"]


def test_running_set_is_bounded_by_max_batch_size_and_new_requests_join_between_steps():
    s = _sched(max_batch_size=2, max_prefill_batch_size=2)
    for i in range(3):
        s.add(_seq(i))
    out = s.schedule()
    assert len(out.prefills) == 2
    _finish_step(s, out)
    out = s.schedule()
    assert len(out.decodes) == 2 and not out.prefills  # r2 waits: batch full
    _finish_step(s, out)
    s.finish(s.running[0])
    out = s.schedule()
    assert len(out.decodes) == 1 and [q.request_id for q in out.prefills] == ["r2"]


def test_preempts_newest_when_blocks_run_out_and_recomputes_it():
    s = _sched(blocks=4, bs=4, max_batch_size=4, max_prefill_batch_size=4)
    a, b = _seq(0, n=4), _seq(1, n=4)
    s.add(a)
    s.add(b)
    out = s.schedule()
    assert len(out.prefills) == 2  # 1 block each
    _finish_step(s, out)
    out = s.schedule()  # each needs a 2nd block: 2 free, fine
    _finish_step(s, out)
    for _ in range(3):
        out = s.schedule()
        _finish_step(s, out)
    out = s.schedule()  # both need a 3rd block; none free: b (newest) is preempted
    assert b in out.preempted and b.status is SeqStatus.WAITING and s.waiting[0] is b
    assert out.decodes == [a]
    assert b.block_table == [] and b.num_computed_tokens == 0
    s.finish(a)
    out = s.schedule()
    assert out.prefills == [b]  # recomputed from prompt + its output so far
    assert b.num_tokens - b.num_computed_tokens == b.num_tokens

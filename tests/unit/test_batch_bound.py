"""Batch-job lines beside online traffic (engine.sched.batch_bound, issue #27): the scheduler's rule on hand-made
steps (no model, no clock). ScheduleConfig.batchPrefillTokens bounds batch prompt tokens in any step;
batchTokensBesideOnline bounds all batch tokens of a step while an online request waits or prefills, and
the batch lines still take turns (no starvation)."""
from __future__ import annotations

from pathlib import Path

import pytest

from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.contract import PRIORITY_BATCH
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.sched.scheduler import Scheduler
from mindie_service.engine.sequence import Sequence, SeqStatus
from mindie_service.engine.step import SchedulerOutput
from mindie_service.errors import ConfigError, MindieError
from mindie_service.sampling_params import SamplingParams
from tests.unit.test_config import load, sched, shipped


def _sched(**kw: object) -> Scheduler:
    cfg = EngineConfig(model="x", cache_block_size=4, max_seq_len=512, max_input_token_len=256,
                       max_prefill_tokens=256, max_batch_size=32, max_prefill_batch_size=16, max_preempt_count=32,
                       **kw)  # type: ignore[arg-type]
    return Scheduler(cfg, BlockManager(1024, 4, enable_prefix_caching=False))


def _seq(rid: str, n: int, max_output: int = 64, batch: bool = False) -> Sequence:
    seq = Sequence(rid, [7] * n, SamplingParams(max_tokens=max_output), max_output, seed=0)
    seq.priority = PRIORITY_BATCH if batch else seq.priority
    return seq


def _step(s: Scheduler) -> SchedulerOutput:
    out = s.schedule()
    s.update(out, {c.request_id: 1 for c in out.sampled}, {})
    return out


def _batch_tokens(out: SchedulerOutput) -> int:
    return sum(c.num_tokens for c in out.chunks if c.request_id.startswith("b"))


def _decoding_batch(s: Scheduler, lines: int, bound: int | None) -> Scheduler:
    for i in range(lines):
        s.add(_seq(f"b{i}", 20, batch=True))
    while any(c.num_tokens > 1 for c in _step(s).chunks):
        pass  # until every line decodes
    return s


def test_an_online_request_waiting_bounds_the_batch_tokens_of_the_next_step() -> None:
    s = _decoding_batch(_sched(batch_tokens_beside_online=4), 10, 4)
    assert _batch_tokens(_step(s)) == 10  # no online request: every line decodes
    s.add(_seq("o0", 40))
    out = _step(s)
    assert [(c.request_id, c.num_tokens) for c in out.prefills] == [("o0", 40)]
    assert _batch_tokens(out) == 4 and len(out.decodes) == 4  # at most the bound, the online prompt whole
    assert _batch_tokens(_step(s)) == 10  # the online request decodes: the batch runs whole again


def test_unbounded_the_whole_batch_rides_with_the_online_prefill() -> None:
    s = _decoding_batch(_sched(batch_tokens_beside_online=None), 10, None)
    s.add(_seq("o0", 40))
    assert _batch_tokens(_step(s)) == 10


def test_batch_lines_take_turns_while_online_requests_keep_arriving() -> None:
    s = _decoding_batch(_sched(batch_tokens_beside_online=3), 10, 3)
    lines = [q for q in s.running if q.request_id.startswith("b")]
    before = {q.request_id: len(q.output_token_ids) for q in lines}
    for k in range(10):  # an online request waits at every step (one chunked prompt: 256 tokens a step)
        s.add(_seq(f"o{k}", 300, max_output=1))
        out = _step(s)
        assert _batch_tokens(out) <= 3
    # 10 pressed steps x 3 rows = 30 decodes over 10 lines: each line ran 3 times, none starved
    assert sorted(len(q.output_token_ids) - before[q.request_id] for q in lines) == [3] * 10


def test_waiting_batch_lines_still_start_beside_online_traffic() -> None:
    s = _sched(batch_tokens_beside_online=8)
    lines = [_seq(f"b{i}", 20, batch=True) for i in range(2)]
    for q in lines:
        s.add(q)
    for k in range(8):  # a new online request waits at every step
        s.add(_seq(f"o{k}", 50))
        out = _step(s)
        assert _batch_tokens(out) <= 8 and (f"o{k}", 50) in [(c.request_id, c.num_tokens) for c in out.prefills]
    # 8 batch tokens a step: b0's prompt (20) takes steps 1-3 (8, 8, 4), b1's steps 3-6 (4, then 7, 7, 2
    # beside b0's decode); each samples at its prompt's last step and decodes in the steps after
    assert [len(q.output_token_ids) for q in lines] == [6, 3]


def test_batch_prompt_tokens_per_step_are_bounded_online_ones_are_not() -> None:
    s = _sched(batch_prefill_tokens=32)
    for i in range(3):
        s.add(_seq(f"b{i}", 50, batch=True))
    steps = [_step(s) for _ in range(3)]
    assert [_batch_tokens(o) for o in steps] == [32, 32 + 0, 32 + 1]  # b0 decodes from step 3 on
    assert [(c.request_id, c.start, c.num_tokens) for c in steps[1].prefills] == [("b0", 32, 18), ("b1", 0, 14)]
    o = _sched(batch_prefill_tokens=32)
    o.add(_seq("o0", 100))
    assert [c.num_tokens for c in _step(o).prefills] == [100]
    u = _sched(batch_prefill_tokens=None)  # the step's whole budget
    for i in range(3):
        u.add(_seq(f"b{i}", 50, batch=True))
    assert _batch_tokens(_step(u)) == 150


def test_schedule_keys_reach_the_engine_and_bad_values_are_refused(tmp_path: Path) -> None:
    doc = shipped()
    e = load(tmp_path, doc).engine_config()
    assert (e.batch_prefill_tokens, e.batch_tokens_beside_online) == (64, 8)
    sched(doc).update(batchPrefillTokens=None, batchTokensBesideOnline=3)
    e = load(tmp_path, doc).engine_config()
    assert (e.batch_prefill_tokens, e.batch_tokens_beside_online) == (None, 3)
    sched(doc).update(batchTokensBesideOnline=0)
    with pytest.raises(ConfigError, match="batchTokensBesideOnline"):
        load(tmp_path, doc)
    with pytest.raises(MindieError, match="batch_prefill_tokens"):
        EngineConfig(model="x", batch_prefill_tokens=0).validate()

"""The real scheduler on hand-made steps (no model): MindIE's limits, preemption, chunked prefill.

Each step is the engine's contract without the model: ``schedule()``, then ``update()`` with a
sampled token for every chunk that samples (what a runner + sampler would return)."""
from __future__ import annotations

from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.sched.scheduler import Scheduler
from mindie_service.engine.sequence import Sequence, SeqStatus
from mindie_service.engine.step import SchedulerOutput
from mindie_service.engine.contract import PRIORITY_BATCH
from mindie_service.sampling_params import SamplingParams


def _sched(blocks: int = 64, bs: int = 4, **kw) -> Scheduler:
    kw.setdefault("max_preempt_count", kw.get("max_batch_size", 200))  # preempt as needed (0: none, see test_preemption)
    cfg = EngineConfig(model="x", cache_block_size=bs, max_seq_len=kw.pop("max_seq_len", 256),
                       max_input_token_len=kw.pop("max_input_token_len", 64),
                       max_prefill_tokens=kw.pop("max_prefill_tokens", 256), **kw)
    return Scheduler(cfg, BlockManager(blocks, bs, enable_prefix_caching=False))


def _seq(i: int, n: int = 6, max_output: int = 8) -> Sequence:
    return Sequence(f"r{i}", [i + 10] * n, SamplingParams(max_tokens=max_output), max_output, seed=0)


def _step(s: Scheduler, token: int = 1, finish: dict[str, str] | None = None) -> SchedulerOutput:
    """One step: schedule, then report a sampled token for each sampling chunk."""
    out = s.schedule()
    s.update(out, {c.request_id: token for c in out.sampled}, finish or {})
    return out


def _ids(chunks) -> list[str]:
    return [c.request_id for c in chunks]


def test_prefill_batch_is_bounded_by_max_prefill_batch_size():
    s = _sched(max_batch_size=8, max_prefill_batch_size=3)
    for i in range(5):
        s.add(_seq(i))
    out = s.schedule()
    assert len(out.prefills) == 3 and len(s.waiting) == 2


def test_prompt_tokens_per_step_are_bounded_by_max_prefill_tokens():
    s = _sched(max_batch_size=8, max_prefill_batch_size=8, max_prefill_tokens=64)
    for i in range(5):
        s.add(_seq(i, n=30))
    out = s.schedule()
    # r0 whole (30), r1 whole (30), r2 its first 4 tokens: 64 prompt tokens, the rest waits.
    assert [(c.request_id, c.num_tokens) for c in out.prefills] == [("r0", 30), ("r1", 30), ("r2", 4)]
    assert out.num_tokens == 64 and [c.sample for c in out.prefills] == [True, True, False]
    assert _ids(s.waiting) == ["r3", "r4"]


def test_running_set_is_bounded_by_max_batch_size_and_new_requests_join_between_steps():
    s = _sched(max_batch_size=2, max_prefill_batch_size=2)
    for i in range(3):
        s.add(_seq(i))
    out = _step(s)
    assert len(out.prefills) == 2
    out = _step(s)
    assert len(out.decodes) == 2 and not out.prefills  # r2 waits: batch full
    s.finish(s.running[0])
    out = _step(s)
    assert len(out.decodes) == 1 and _ids(out.prefills) == ["r2"]


def test_update_advances_counters_appends_tokens_and_finishes():
    s = _sched()
    a, b = _seq(0, n=5), _seq(1, n=5)
    s.add(a)
    s.add(b)
    out = s.schedule()
    assert [c.start for c in out.chunks] == [0, 0]
    s.update(out, {"r0": 7, "r1": 9}, {"r1": "eos_token"})
    assert a.num_computed_tokens == 5 and a.output_token_ids == [7]
    assert b.status is SeqStatus.FINISHED and b.finish_reason == "eos_token" and b.block_table == []
    assert s.get("r1") is None and s.running == [a]
    out = s.schedule()
    assert _ids(out.decodes) == ["r0"] and out.decodes[0].token_ids == (7,) and out.decodes[0].start == 5


def test_aborted_request_in_a_step_is_skipped_by_update():
    s = _sched()
    a = _seq(0)
    s.add(a)
    out = s.schedule()
    s.finish(a)  # aborted while the step ran
    s.update(out, {"r0": 3}, {})
    assert a.output_token_ids == [] and a.status is SeqStatus.FINISHED


def test_preempts_newest_when_blocks_run_out_and_recomputes_it():
    s = _sched(blocks=4, bs=4, max_batch_size=4, max_prefill_batch_size=4)
    a, b = _seq(0, n=4), _seq(1, n=4)
    s.add(a)
    s.add(b)
    out = _step(s)
    assert len(out.prefills) == 2  # 1 block each
    for _ in range(4):  # each takes a 2nd block: 2 free, fine
        _step(s)
    out = s.schedule()  # both need a 3rd block; none free: b (newest) is preempted
    assert out.preempted == ["r1"] and b.status is SeqStatus.WAITING and s.waiting[0] is b
    assert _ids(out.decodes) == ["r0"]
    assert b.block_table == [] and b.num_computed_tokens == 0
    s.update(out, {"r0": 1}, {"r0": "length"})
    out = s.schedule()
    # Recomputed from its prompt plus its output so far, in one chunk that samples its next token.
    assert _ids(out.prefills) == ["r1"] and out.prefills[0].num_tokens == b.num_tokens == 9
    assert out.prefills[0].token_ids == tuple(b.prompt_token_ids + b.output_token_ids) and out.prefills[0].sample


def test_long_prompt_is_chunked_while_running_requests_keep_decoding():
    """maxPrefillTokens is the step's prompt-token budget: a 40-token prompt arriving beside a streaming
    request is computed 16 tokens a step, and the stream gets a token in every one of those steps."""
    s = _sched(blocks=64, bs=4, max_prefill_tokens=16)
    stream = _seq(0, n=4, max_output=50)
    s.add(stream)
    _step(s)
    long = _seq(1, n=40)
    s.add(long)
    order: list[list[tuple[str, int, int]]] = []
    while long.num_computed_tokens < 40:
        out = _step(s)
        order.append([(c.request_id, c.start, c.num_tokens) for c in out.chunks])
    assert order == [[("r0", 4, 1), ("r1", 0, 16)],
                     [("r0", 5, 1), ("r1", 16, 16)],
                     [("r0", 6, 1), ("r1", 32, 8)]]
    assert long.output_token_ids == [1] and len(stream.output_token_ids) == 4
    assert all(len(q.block_table) * 4 >= q.num_computed_tokens for q in (stream, long))


def test_chunks_of_one_prompt_continue_before_new_admissions():
    s = _sched(max_prefill_tokens=8, max_input_token_len=64)
    s.add(_seq(0, n=20))
    s.add(_seq(1, n=4))
    assert [(c.request_id, c.start, c.num_tokens) for c in _step(s).chunks] == [("r0", 0, 8)]
    assert [(c.request_id, c.start, c.num_tokens) for c in _step(s).chunks] == [("r0", 8, 8)]
    out = _step(s)  # r0's last 4 tokens, then r1 takes the rest of the budget
    assert [(c.request_id, c.start, c.num_tokens) for c in out.chunks] == [("r0", 16, 4), ("r1", 0, 4)]
    assert [c.sample for c in out.chunks] == [True, True]


# ------------------------------------------------------------------ priorities (batch jobs below online traffic)
def _batch(i: int, n: int = 6, max_output: int = 8) -> Sequence:
    seq = _seq(i, n, max_output)
    seq.priority = PRIORITY_BATCH
    return seq


def test_online_requests_wait_ahead_of_batch_lines():
    s = _sched(max_batch_size=8, max_prefill_batch_size=1)
    for q in (_batch(0), _batch(1), _seq(2), _batch(3), _seq(4)):
        s.add(q)
    assert _ids(s.waiting) == ["r2", "r4", "r0", "r1", "r3"]
    assert _ids(_step(s).prefills) == ["r2"]


def test_online_request_preempts_batch_lines_for_a_batch_slot():
    s = _sched(max_batch_size=2, max_prefill_batch_size=2)
    a, b = _batch(0), _batch(1)
    s.add(a)
    s.add(b)
    _step(s)
    s.add(_seq(2))
    out = _step(s)
    assert out.preempted == ["r1"] and _ids(out.decodes) == ["r0"] and _ids(out.prefills) == ["r2"]
    assert b.status is SeqStatus.WAITING and s.waiting[0] is b


def test_online_request_preempts_batch_lines_for_blocks_and_batch_goes_first_when_the_pool_is_dry():
    s = _sched(blocks=6, bs=4, max_batch_size=8, max_prefill_batch_size=8)
    lines = [_batch(0, n=8), _batch(1, n=8)]
    for q in lines:
        s.add(q)
    _step(s)  # 4 of 6 blocks taken by batch lines
    online = _seq(2, n=12)  # needs 3 blocks: the newest batch line makes room
    s.add(online)
    out = _step(s)
    assert out.preempted == ["r1"] and _ids(out.prefills) == ["r2"]
    # Later the pool runs dry while decoding: the batch line is preempted, not the newer online request.
    while True:
        out = _step(s)
        if out.preempted:
            break
    assert out.preempted == ["r0"] and online.status is SeqStatus.RUNNING


def test_online_request_whose_prefix_is_cached_does_not_preempt_a_batch_line():
    """An online request counts its prefix-cache hits when it looks for room: here it needs one new block, one
    is free, so the decoding batch line keeps its work (counting all 4 of its blocks preempted the line, which
    then came back as a recomputed prefill in the same step)."""
    cfg = EngineConfig(model="x", cache_block_size=4, max_seq_len=64, max_input_token_len=32, max_prefill_tokens=64,
                       max_batch_size=8, max_prefill_batch_size=8, max_preempt_count=8)
    s = Scheduler(cfg, BlockManager(7, 4, enable_prefix_caching=True))
    s.add(Sequence("r0", [7] * 12, SamplingParams(max_tokens=8), 8, seed=0))
    _step(s)  # r0's 12 prompt tokens fill 3 blocks, now in the prefix cache
    line = _batch(1, n=7)
    s.add(line)
    _step(s)  # r0 decodes into a 4th block, the line takes 2: one block is left
    assert s.blocks.num_available_blocks == 1
    s.add(Sequence("r2", [7] * 12 + [9], SamplingParams(max_tokens=4), 4, seed=0))
    out = _step(s)
    assert out.preempted == [] and _ids(out.decodes) == ["r0", "r1"] and _ids(out.prefills) == ["r2"]
    assert out.prefills[0].start == 12  # its first 3 blocks came from the cache

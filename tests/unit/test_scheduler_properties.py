"""Property tests of the scheduler and the block manager together (hypothesis): random arrivals,
prompt lengths, aborts, finishes and pool sizes, checked after every step against the invariants
the engine relies on."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from mindie_service.engine.block_manager import BlockManager
from mindie_service.engine.config import EngineConfig
from mindie_service.engine.scheduler import Scheduler
from mindie_service.engine.sequence import Sequence, SeqStatus
from mindie_service.engine.types import PRIORITY_BATCH, PRIORITY_ONLINE
from mindie_service.sampling_params import SamplingParams

BS = 4

# prompt len, max output, token value, batch-job priority
_request = st.tuples(st.integers(1, 40), st.integers(1, 12), st.integers(0, 3), st.booleans())
_event = st.one_of(st.tuples(st.just("add"), _request), st.tuples(st.just("abort"), st.integers(0, 50)),
                   st.tuples(st.just("step"), st.booleans()))


def _check_invariants(s: Scheduler, bm: BlockManager, out, budget: int) -> None:
    owners: dict[int, int] = {}
    for seq in s.running:
        assert seq.status is SeqStatus.RUNNING
        for b in seq.block_table:
            owners[b] = owners.get(b, 0) + 1
        assert len(seq.block_table) * BS >= seq.num_computed_tokens  # computed K/V always has a home
    for b, n in owners.items():
        assert bm.ref_counts[b] >= n and b not in bm.free  # a block in use is never handed out
    assert all(bm.ref_counts[b] == 0 for b in bm.free)
    assert len(s.running) <= s.cfg.max_batch_size
    prompt_tokens = sum(c.num_tokens for c in out.prefills)
    assert prompt_tokens <= budget
    for c in out.chunks:  # every token written this step has a slot in its block table
        assert len(c.block_table) * BS >= c.end
    assert len({c.request_id for c in out.chunks}) == len(out.chunks)
    prios = [q.priority for q in s.waiting]
    assert prios == sorted(prios)  # online requests always wait ahead of batch-job lines


@settings(max_examples=150, deadline=None)
@given(events=st.lists(_event, min_size=1, max_size=80), num_blocks=st.integers(12, 40),
       budget=st.integers(1, 48), prefix=st.booleans())
def test_random_traffic_keeps_block_and_budget_invariants_and_drains(events, num_blocks, budget, prefix):
    cfg = EngineConfig(model="x", cache_block_size=BS, max_seq_len=48, max_input_token_len=40, max_iter_times=12,
                       max_batch_size=6, max_prefill_batch_size=4, max_prefill_tokens=budget)
    bm = BlockManager(num_blocks, BS, enable_prefix_caching=prefix)
    s = Scheduler(cfg, bm)
    seqs: list[Sequence] = []

    def step(eos: bool) -> None:
        out = s.schedule()
        _check_invariants(s, bm, out, budget)
        sampled = {c.request_id: 5 for c in out.sampled}
        finished = {}
        for c in out.sampled:
            seq = s.get(c.request_id)
            if len(seq.output_token_ids) + 1 >= seq.max_output:
                finished[c.request_id] = "length"
            elif eos:
                finished[c.request_id] = "eos_token"
        s.update(out, sampled, finished)

    for kind, arg in events:
        if kind == "add":
            n, max_out, v, batch = arg
            max_out = max(1, min(max_out, num_blocks * BS - n))  # the engine caps output to the pool (add_request)
            seq = Sequence(f"r{len(seqs)}", [v] * n, SamplingParams(max_tokens=max_out), max_out, seed=0,
                           priority=PRIORITY_BATCH if batch else PRIORITY_ONLINE)
            seqs.append(seq)
            s.add(seq)
        elif kind == "abort" and arg < len(seqs) and not seqs[arg].is_finished:
            s.finish(seqs[arg])
        elif kind == "step":
            step(arg)
    for _ in range(2000):  # everything admitted finishes: nobody starves, the pool is whole again
        if not s.has_work():
            break
        step(False)
    assert not s.has_work()
    assert bm.num_free_blocks == num_blocks
    for seq in seqs:
        assert seq.is_finished and seq.block_table == []
        if seq.finish_reason == "length":
            assert len(seq.output_token_ids) == seq.max_output

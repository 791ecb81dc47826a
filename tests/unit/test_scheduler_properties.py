"""Property tests of the scheduler and the block manager together (hypothesis): random arrivals,
prompt lengths, aborts, finishes, pool sizes, maxPreemptCount and host (swap) pools, checked after
every step against the invariants the engine relies on. A stand-in for the runner keeps each KV
slot's content, applies the step's swaps and checks that every chunk reads the K/V of its own
tokens: no block is lost, clobbered or handed out twice, swapped or not."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.sched.scheduler import Scheduler, _prefilling
from mindie_service.engine.sequence import Sequence, SeqStatus
from mindie_service.engine.kv.swap import HostBlockPool
from mindie_service.engine.contract import PRIORITY_BATCH, PRIORITY_ONLINE
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


def _check_preemption(s: Scheduler, out, decoding: set[str]) -> None:
    """maxPreemptCount: 0 preempts nothing for want of blocks (only batch lines, for online requests) and
    no running decode ever lacks a block; otherwise at most the cap of online requests per round, unless
    nothing else would run."""
    online = [rid for rid in out.preempted if (q := s.seqs.get(rid)) is None or q.priority == PRIORITY_ONLINE]
    cap = s.cfg.max_preempt_count
    if cap == 0:
        assert not online
        assert decoding <= {c.request_id for c in out.decodes}  # still running: every one got its slot
    else:
        assert len(online) <= cap or len(out.chunks) == 1


def _check_swaps(s: Scheduler, out) -> None:
    if s.host is None:
        assert not out.swap_out and not out.swap_in and not s.swapped
        return
    held = [b for q in s.swapped for b in q.host_blocks]
    assert len(held) == len(set(held)) and len(held) <= s.host.num_used
    for q in s.swapped:
        assert q.status is SeqStatus.SWAPPED and q.block_table == []
        assert len(q.host_blocks) == s.blocks.blocks_needed(q.num_computed_tokens)
    assert len({d for d, _ in out.swap_out}) == len(out.swap_out)
    assert len({d for _, d in out.swap_in}) == len(out.swap_in)


class _KV:
    """Each slot's content, as (position, token): what the runner would have written there."""

    def __init__(self) -> None:
        self.dev: dict[int, dict[int, tuple[int, int]]] = {}
        self.host: dict[int, dict[int, tuple[int, int]]] = {}

    def run(self, s: Scheduler, out) -> None:
        for d, h in out.swap_out:  # the runner's order: swap-outs, swap-ins, then the forward
            self.host[h] = dict(self.dev.get(d, {}))
        for h, d in out.swap_in:
            self.dev[d] = dict(self.host[h])
        for c in out.chunks:
            seq = s.seqs[c.request_id]
            for p in range(c.start):  # the context this chunk attends to is its own tokens' K/V
                assert self.dev.get(c.block_table[p // BS], {}).get(p % BS) == (p, seq.token_at(p)), (c, p)
            for i, p in enumerate(range(c.start, c.end)):
                self.dev.setdefault(c.block_table[p // BS], {})[p % BS] = (p, c.token_ids[i])


@settings(max_examples=150, deadline=None)
@given(events=st.lists(_event, min_size=1, max_size=80), num_blocks=st.integers(12, 40),
       budget=st.integers(1, 48), prefix=st.booleans(), preempt_cap=st.sampled_from([0, 1, 6]),
       host_blocks=st.sampled_from([0, 6, 64]))
def test_random_traffic_keeps_block_and_budget_invariants_and_drains(events, num_blocks, budget, prefix,
                                                                    preempt_cap, host_blocks):
    cfg = EngineConfig(model="x", cache_block_size=BS, max_seq_len=48, max_input_token_len=40, max_iter_times=12,
                       max_batch_size=6, max_prefill_batch_size=4, max_prefill_tokens=budget,
                       max_preempt_count=preempt_cap)
    bm = BlockManager(num_blocks, BS, enable_prefix_caching=prefix)
    s = Scheduler(cfg, bm, host=HostBlockPool(host_blocks))
    seqs: list[Sequence] = []
    kv = _KV()

    def step(eos: bool) -> None:
        decoding = {q.request_id for q in s.running if not _prefilling(q)}
        out = s.schedule()
        _check_invariants(s, bm, out, budget)
        _check_preemption(s, out, decoding & {q.request_id for q in s.running})
        _check_swaps(s, out)
        kv.run(s, out)
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
    assert bm.num_free_blocks == num_blocks and bm.reserved == 0
    if s.host is not None:
        s.host.step_done()
        assert s.host.num_used == 0
    for seq in seqs:
        assert seq.is_finished and seq.block_table == []
        if seq.finish_reason == "length":
            assert len(seq.output_token_ids) == seq.max_output

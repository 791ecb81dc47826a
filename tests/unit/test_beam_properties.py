"""Property test of beams in the scheduler and block manager (hypothesis): random beam-search and plain
requests, random logits, tight pools (forks that fail, group restarts, preemption), checked every step:
a block written by a step is never shared (copy-on-write), blocks in use are never free, and everything
drains with the pool whole again."""
from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from mindie_service.engine.sample.beam import BeamSearch
from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.sched.scheduler import Scheduler
from mindie_service.engine.sequence import Sequence, SeqStatus
from mindie_service.engine.contract import FINISH_EOS, FINISH_LENGTH, TokenEvent, TokenInfo
from mindie_service.sampling_params import SamplingParams

BS, VOCAB, EOS = 4, 12, 0


class _Outputs:
    """The OutputProcessor's part BeamSearch uses, without a tokenizer."""

    def token(self, seq, tid, lp, top):
        n = len(seq.output_token_ids) + 1
        reason = FINISH_EOS if tid == EOS else FINISH_LENGTH if n >= seq.max_output else None
        return TokenEvent(seq.request_id, TokenInfo(tid, lp, "", False), "", n - 1, reason)

    def drop(self, rid):
        pass


def _check(s: Scheduler, bm: BlockManager, out) -> None:
    owners: dict[int, int] = {}
    for seq in s.running:
        assert seq.status is SeqStatus.RUNNING
        for b in seq.block_table:
            owners[b] = owners.get(b, 0) + 1
    for b, n in owners.items():
        assert bm.ref_counts[b] >= n and b not in bm.free
    assert all(bm.ref_counts[b] == 0 for b in bm.free)
    assert len(s.running) <= s.cfg.max_batch_size
    for c in out.chunks:
        assert len(c.block_table) * BS >= c.end
        for pos in range(c.start, c.end):  # copy-on-write: a block written this step has one owner
            assert bm.ref_counts[c.block_table[pos // BS]] == 1, (c.request_id, pos)
    groups: dict[int, list[str]] = {}
    for c in out.sampled:
        seq = s.get(c.request_id)
        if seq is not None and seq.group is not None:
            groups.setdefault(id(seq.group), []).append(c.request_id)
    for seq in s.running:  # all live beams of a group are sampled in the same step
        if seq.group is not None and id(seq.group) in groups:
            assert seq.request_id in groups[id(seq.group)]


_req = st.tuples(st.integers(1, 14), st.integers(1, 8), st.sampled_from([1, 1, 2, 3, 4]))


@settings(max_examples=40, deadline=None)
@given(reqs=st.lists(_req, min_size=1, max_size=8), num_blocks=st.integers(16, 48), seed=st.integers(0, 2**16),
       arrivals=st.lists(st.integers(0, 6), min_size=8, max_size=8))
def test_beams_keep_copy_on_write_and_drain(reqs, num_blocks, seed, arrivals):
    cfg = EngineConfig(model="x", cache_block_size=BS, max_seq_len=32, max_input_token_len=16, max_iter_times=8,
                       max_batch_size=8, max_prefill_batch_size=4, max_prefill_tokens=16)
    bm = BlockManager(num_blocks, BS, enable_prefix_caching=True)
    s = Scheduler(cfg, bm)
    beams = BeamSearch(s, _Outputs(), frozenset({EOS}))
    gen = torch.Generator().manual_seed(seed)
    pending = list(enumerate(reqs))
    done: set[str] = set()
    ids: list[str] = []
    for step in range(3000):
        while pending and (not arrivals or arrivals[pending[0][0] % len(arrivals)] <= step):
            i, (n, max_out, k) = pending.pop(0)
            if k * bm.blocks_needed(n + max_out) > num_blocks:
                continue  # the engine refuses it (check_beam_request)
            seq = Sequence(f"r{i}", [(i + t) % VOCAB for t in range(n)],
                           SamplingParams(max_tokens=max_out, temperature=0.0, num_beams=k), max_out, seed=0)
            ids.append(seq.request_id)
            (beams.add if k > 1 else s.add)(seq)
        if not s.has_work() and not pending:
            break
        out = s.schedule()
        _check(s, bm, out)
        sampled, finished, rows = {}, {}, {}
        for c in out.sampled:
            seq = s.get(c.request_id)
            logits = torch.randn(VOCAB, generator=gen)
            if seq.group is not None:
                rows.setdefault(seq.group, {})[seq] = logits
                continue
            tid = int(logits.argmax())
            sampled[c.request_id] = tid
            if tid == EOS or len(seq.output_token_ids) + 1 >= seq.max_output:
                finished[c.request_id] = "done"
                done.add(c.request_id)
        s.update(out, sampled, finished)
        for group, r in rows.items():
            if group.request_id in beams.groups:
                for ev in beams.advance(group, r):
                    if ev.finish_reason is not None:
                        done.add(ev.request_id)
    assert not s.has_work() and not beams.groups
    assert set(ids) == done  # every request ended, beam searches with their chosen beam
    assert all(r == 0 for r in bm.ref_counts) and bm.num_free_blocks == num_blocks

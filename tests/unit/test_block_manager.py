"""KV block pool: allocation, prefix sharing by content + cache key, reference counts, LRU eviction."""
from __future__ import annotations

from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.sequence import Sequence
from mindie_service.sampling_params import SamplingParams


def _seq(rid: str, tokens: list[int], key: bytes = b"") -> Sequence:
    return Sequence(rid, tokens, SamplingParams(max_tokens=4), 4, seed=0, cache_key=key)


def _computed(bm: BlockManager, seq: Sequence) -> None:
    seq.num_computed_tokens = seq.num_tokens
    bm.register_computed(seq)


def test_allocate_and_free_returns_every_block():
    bm = BlockManager(8, 4)
    s = _seq("a", list(range(10)))
    assert bm.allocate(s)
    assert len(s.block_table) == 3 and bm.num_free_blocks == 5
    bm.free_seq(s)
    assert bm.num_free_blocks == 8 and s.block_table == []


def test_allocation_fails_cleanly_when_pool_is_short():
    bm = BlockManager(2, 4)
    s = _seq("a", list(range(10)))
    assert not bm.allocate(s)
    assert bm.num_free_blocks == 2 and s.block_table == []


def test_identical_prefix_shares_full_blocks_only():
    bm = BlockManager(16, 4)
    a = _seq("a", list(range(10)))
    assert bm.allocate(a)
    _computed(bm, a)
    b = _seq("b", list(range(8)) + [99, 98, 97])
    assert bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2]  # two full blocks shared
    assert b.block_table[2] != a.block_table[2]
    assert b.num_cached_tokens == 8
    assert bm.ref_counts[a.block_table[0]] == 2


def test_whole_prompt_hit_still_computes_last_token():
    bm = BlockManager(16, 4)
    a = _seq("a", list(range(8)))
    bm.allocate(a)
    _computed(bm, a)
    b = _seq("b", list(range(8)))
    bm.allocate(b)
    assert b.num_cached_tokens == 4  # the last block is recomputed so the step yields logits


def test_cache_key_separates_adapters_and_media():
    bm = BlockManager(16, 4)
    a = _seq("a", list(range(10)), key=b"adapter-1")
    bm.allocate(a)
    _computed(bm, a)
    b = _seq("b", list(range(10)), key=b"adapter-2")
    bm.allocate(b)
    assert b.num_cached_tokens == 0 and not set(a.block_table) & set(b.block_table)


def test_freed_blocks_stay_reusable_until_evicted():
    bm = BlockManager(4, 4)
    a = _seq("a", list(range(9)))
    bm.allocate(a)
    _computed(bm, a)
    bm.free_seq(a)
    b = _seq("b", list(range(9)))
    bm.allocate(b)
    assert b.num_cached_tokens == 8
    bm.free_seq(b)
    c = _seq("c", [50 + i for i in range(16)])  # needs all 4 blocks: evicts the cached ones
    assert bm.allocate(c)
    assert not bm.cached
    d = _seq("d", list(range(9)))
    bm.free_seq(c)
    bm.allocate(d)
    assert d.num_cached_tokens == 0


def test_decode_appends_a_block_at_the_boundary():
    bm = BlockManager(4, 4)
    s = _seq("a", list(range(4)))
    bm.allocate(s)
    s.output_token_ids.append(7)  # 5 tokens now: the 5th needs a second block
    assert bm.can_append(s)
    bm.append_slot(s)
    assert len(s.block_table) == 2

"""Prefix-aware instance routing (fleet.prefix_routing): each instance's index follows its block manager's
prefix-cache events; a request goes to the instance holding the longest cached prefix of its prompt unless
that instance is much more loaded (LOAD_SLACK), adapters and evictions included."""
from __future__ import annotations

from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.fleet.instances import InstanceRouter
from mindie_service.fleet.prefix_routing import LOAD_SLACK, PrefixIndex, PrefixRouter
from mindie_service.engine.sequence import Sequence
from mindie_service.engine.contract import EngineRequest
from mindie_service.sampling_params import SamplingParams
from tests.unit.test_instances import FakeEngine

BS = 4
SYSTEM = list(range(100, 124))  # six full blocks


def _instance(num_blocks: int = 64) -> tuple[BlockManager, PrefixIndex]:
    bm, index = BlockManager(num_blocks, BS), PrefixIndex(BS)
    bm.events = index
    return bm, index


def _compute(bm: BlockManager, rid: str, ids: list[int], adapter: str | None = None,
             cache_key: bytes = b"") -> Sequence:
    """Prefill ``ids`` on ``bm`` (the engine's allocate + register once computed) and finish the sequence."""
    seq = Sequence(rid, ids, SamplingParams(max_tokens=4, adapter_id=adapter), 4, seed=0, cache_key=cache_key)
    assert bm.allocate(seq)
    seq.num_computed_tokens = len(ids)
    bm.register_computed(seq)
    bm.free_seq(seq)
    return seq


def _req(rid: str, ids: list[int], adapter: str | None = None) -> EngineRequest:
    return EngineRequest(rid, tuple(ids), SamplingParams(max_tokens=4, adapter_id=adapter))


def _router(indexes) -> InstanceRouter:
    router = InstanceRouter([FakeEngine(), FakeEngine()])
    router.prefix = PrefixRouter(indexes, BS)
    return router


def test_the_instance_holding_the_prompt_prefix_gets_the_request():
    (bm0, i0), (bm1, i1) = _instance(), _instance()
    _compute(bm1, "warm", SYSTEM + [1, 2, 3])
    router = _router([i0, i1])
    prompt = SYSTEM + [7, 8, 9, 10, 11]
    assert i1.held(router.prefix.keys(_req("q", prompt))) == 6 and i0.held(router.prefix.keys(_req("q", prompt))) == 0
    assert [router.choose(_req(f"q{k}", prompt)) for k in range(4)] == [1, 1, 1, 1]  # not in turn: by prefix
    assert router.choose(_req("other", [5] * 30)) == 0  # no prefix anywhere: least loaded, in turn


def test_a_much_more_loaded_holder_loses_to_the_least_loaded():
    (_, i0), (bm1, i1) = _instance(), _instance()
    _compute(bm1, "warm", SYSTEM)
    router = _router([i0, i1])
    router._load[1].in_flight = LOAD_SLACK
    assert router.choose(_req("a", SYSTEM + [1])) == 1  # LOAD_SLACK more in flight: still worth it
    router._load[1].in_flight = LOAD_SLACK + 1
    assert router.choose(_req("b", SYSTEM + [1])) == 0
    router._load[0].in_flight, router._load[1].in_flight = 6, 12  # twice the least-loaded's: still the holder
    assert router.choose(_req("c", SYSTEM + [1])) == 1


def test_adapters_key_their_blocks_by_name_and_engine_identities_do_not_matter():
    (bm0, i0), (bm1, i1) = _instance(), _instance()
    _compute(bm0, "base", SYSTEM)  # base model on instance 0
    _compute(bm1, "ad", SYSTEM, adapter="ad", cache_key=b"lora:instance-1-identity")  # the adapter on 1
    router = _router([i0, i1])
    assert router.choose(_req("x", SYSTEM + [1], adapter="ad")) == 1
    assert router.choose(_req("y", SYSTEM + [1])) == 0


def test_evicted_blocks_leave_the_index():
    (_, i0), (bm1, i1) = _instance(), _instance(num_blocks=8)
    _compute(bm1, "warm", SYSTEM)
    keys = PrefixRouter([i0, i1], BS).keys(_req("k", SYSTEM))
    assert i1.held(keys) == 6
    _compute(bm1, "flood", list(range(500, 532)))  # 8 blocks: every cached block handed out again
    assert i1.held(keys) == 0 and set(i1._key) == set(bm1.cached) and sum(i1._count.values()) == len(bm1.cached)


def test_a_prompt_cache_key_keeps_its_requests_on_one_instance():
    """Before any block of a shared prefix is stored, requests naming one prompt_cache_key meet on the instance
    the key went to first (not in turn); a more loaded one by more than the slack loses, as for a prefix."""
    (_, i0), (_, i1) = _instance(), _instance()
    router = _router([i0, i1])

    def req(rid: str, key: str | None) -> EngineRequest:
        return EngineRequest(rid, tuple(SYSTEM), SamplingParams(max_tokens=4, cache_key=key))
    assert [router.choose(req(f"n{k}", None)) for k in range(3)] == [0, 1, 0]  # no key: in turn
    first = router.choose(req("a0", "team-a"))
    assert [router.choose(req(f"a{k}", "team-a")) for k in range(1, 4)] == [first] * 3
    router._load[first].in_flight = LOAD_SLACK + 1
    assert router.choose(req("a9", "team-a")) != first

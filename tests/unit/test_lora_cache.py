"""LoRA and the engine's shared state: prefix-cache identity, LRU residency, pins, preemption."""
from __future__ import annotations

import pytest

from mindie_service import LLM, SamplingParams
from mindie_service.engine.core import LLMEngine
from mindie_service.engine.contract import EngineRequest
from mindie_service.devkit.lora import build_demo_lora

PROMPT = "Harbor lantern winter bridge orange violin forest letter museum thunder candle meadow pilot ocean"
N = 24


@pytest.fixture(scope="module")
def adapters(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-cache")
    return {f"r{r}": str(build_demo_lora(str(tiny_model), str(root / f"r{r}"), rank=r, seed=100 + r))
            for r in (4, 8, 16)}


def _llm(tiny_model, adapters, **kw) -> LLM:
    kw = {"cache_block_size": 4, "num_kv_blocks": 256, "max_loras": 3, "max_lora_rank": 16, **kw}
    llm = LLM(str(tiny_model), **kw)
    for name, path in adapters.items():
        llm.engine.load_adapter(name, path)
    return llm


def _params(adapter: str | None, n: int = N) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, adapter_id=adapter)


def _run(llm: LLM, adapter: str | None, prompt: str = PROMPT, n: int = N) -> list[int]:
    return llm.generate([prompt], _params(adapter, n), use_tqdm=False)[0].outputs[0].token_ids


def _drain(eng: LLMEngine, outs: dict[str, list[int]], until: set[str] | None = None, steps: int | None = None) -> None:
    """Step the engine (until the named requests finished, or a number of steps, or it is idle)."""
    done: set[str] = set()
    while eng.has_work() and (until is None or not until <= done) and (steps is None or steps > 0):
        for ev in eng.step():
            outs.setdefault(ev.request_id, []).append(ev.token.id)
            if ev.finish_reason is not None:
                done.add(ev.request_id)
        steps = None if steps is None else steps - 1


@pytest.fixture(scope="module")
def expected(tiny_model, adapters):
    """Each adapter's output without any prefix cache (parity with peft is proven in test_lora_parity)."""
    llm = _llm(tiny_model, adapters, enable_prefix_caching=False)
    return {a: _run(llm, a) for a in (None, *adapters)}


def test_same_prompt_under_two_adapters_never_shares_blocks(tiny_model, adapters, expected):
    llm = _llm(tiny_model, adapters)
    eng = llm.engine
    assert _run(llm, "r4") == expected["r4"]  # fills the cache for (prompt, r4)
    ids = llm.tokenizer(PROMPT).input_ids
    seqs = {}
    for rid, adapter in (("r8", "r8"), ("base", None), ("r4-again", "r4")):
        seqs[rid] = eng.add_request(EngineRequest(rid, ids, _params(adapter)))
        outs: dict[str, list[int]] = {}
        _drain(eng, outs, steps=1)
        seqs[rid].cached = seqs[rid].num_cached_tokens
        _drain(eng, outs)
        assert outs[rid] == expected[adapter]
    assert seqs["r8"].cached == 0 and seqs["base"].cached == 0
    assert seqs["r4-again"].cached > 0
    assert len({s.cache_key for s in seqs.values()}) == 3
    hashes = [set(s.block_hashes) for s in seqs.values()]
    assert not hashes[0] & hashes[1] and not hashes[0] & hashes[2] and not hashes[1] & hashes[2]


def test_cold_and_cached_runs_agree_for_every_adapter(tiny_model, adapters, expected):
    llm = _llm(tiny_model, adapters)
    blocks = llm.engine.blocks
    for adapter in (None, *adapters):
        hits = blocks.prefix_hits
        assert _run(llm, adapter) == expected[adapter]  # cold for this adapter (others' blocks are cached)
        assert blocks.prefix_hits == hits
        assert _run(llm, adapter) == expected[adapter]  # cached
        assert blocks.prefix_hits == hits + 1


def test_reload_under_the_same_name_is_a_new_adapter(tiny_model, adapters, expected):
    llm = _llm(tiny_model, {})
    eng = llm.engine
    eng.load_adapter("x", adapters["r4"])
    first_id = eng.list_adapters()[0]["id"]
    assert _run(llm, "x") == expected["r4"]
    eng.unload_adapter("x")
    eng.load_adapter("x", adapters["r8"])  # same name, other weights: the old KV blocks must not be reused
    assert eng.list_adapters()[0]["id"] != first_id
    hits = eng.blocks.prefix_hits
    assert _run(llm, "x") == expected["r8"]
    assert eng.blocks.prefix_hits == hits
    eng.unload_adapter("x")
    eng.load_adapter("x", adapters["r8"])  # even the same folder again gets a fresh identity
    assert _run(llm, "x") == expected["r8"] and eng.blocks.prefix_hits == hits


def test_lru_with_two_slots_and_three_adapters(tiny_model, adapters, expected):
    llm = _llm(tiny_model, adapters, max_loras=2)
    pool = llm.engine.lora.pool
    for adapter in ("r4", "r8", "r16", "r4", None, "r8", "r16"):
        assert _run(llm, adapter) == expected[adapter]
        resident = [a["name"] for a in llm.engine.list_adapters() if a["resident"]]
        assert len(resident) <= 2 and (adapter is None or adapter in resident)
    assert pool.evictions >= 4


def test_the_least_recently_used_adapter_is_evicted_not_the_first_loaded(tiny_model, adapters, expected):
    """r4, r8, r4, r16 in two slots: LRU evicts r8 (r4 was used since), FIFO would evict r4."""
    llm = _llm(tiny_model, adapters, max_loras=2)
    for adapter in ("r4", "r8", "r4", "r16"):
        assert _run(llm, adapter) == expected[adapter]
    assert {a["name"] for a in llm.engine.list_adapters() if a["resident"]} == {"r4", "r16"}


def test_pinned_adapter_is_not_evicted(tiny_model, adapters, expected):
    llm = _llm(tiny_model, adapters, max_loras=2)
    eng, pool = llm.engine, llm.engine.lora.pool
    ids = llm.tokenizer(PROMPT).input_ids
    long_ref = _run(_llm(tiny_model, adapters, enable_prefix_caching=False), "r4", n=80)
    outs: dict[str, list[int]] = {}
    eng.add_request(EngineRequest("long", ids, _params("r4", 80)))
    _drain(eng, outs, steps=2)
    for i, adapter in enumerate(("r8", "r16", "r8")):  # r4 is the least recently used but pinned
        eng.add_request(EngineRequest(f"short{i}", ids, _params(adapter)))
        _drain(eng, outs, until={f"short{i}"})
        assert outs[f"short{i}"] == expected[adapter]
        resident = {a["name"] for a in eng.list_adapters() if a["resident"]}
        assert resident == {"r4", adapter}
    _drain(eng, outs)
    assert outs["long"] == long_ref
    assert pool.evictions >= 2 and all(p == 0 for p in pool.pins)


def test_request_waits_for_a_slot_when_every_slot_is_pinned(tiny_model, adapters, expected):
    llm = _llm(tiny_model, adapters, max_loras=1)
    eng = llm.engine
    ids = llm.tokenizer(PROMPT).input_ids
    eng.add_request(EngineRequest("a", ids, _params("r4")))
    eng.add_request(EngineRequest("b", ids, _params("r8")))
    outs: dict[str, list[int]] = {}
    _drain(eng, outs, steps=1)
    assert [s.request_id for s in eng.scheduler.running] == ["a"]
    assert [s.request_id for s in eng.scheduler.waiting] == ["b"]
    _drain(eng, outs)
    assert outs == {"a": expected["r4"], "b": expected["r8"]}


def test_preemption_with_mixed_adapters(tiny_model, adapters, expected):
    # 30 blocks of 4 tokens cannot hold 8 sequences of ~40 tokens: the scheduler preempts and recomputes.
    llm = _llm(tiny_model, adapters, num_kv_blocks=30, max_loras=2, max_batch_size=8)
    names = [None, "r4", "r8", "r16"] * 2
    outs = llm.generate([PROMPT] * 8, [_params(a) for a in names], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [expected[a] for a in names]
    assert llm.engine.stats().num_preemptions > 0
    assert all(p == 0 for p in llm.engine.lora.pool.pins)
    assert all(a["in_use"] == 0 for a in llm.engine.list_adapters())

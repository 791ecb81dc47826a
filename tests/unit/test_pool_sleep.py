"""A level-1 sleep (issue 46) frees the engine's KV pool, measured in the process's RSS, and keeps its weights;
waking allocates a fresh pool and the outputs are identical to those before (the prefix cache was forgotten with the
pool's contents: a stale hit would read zeros and change them). Engines whose pool outlives the step elsewhere are
refused, naming why. And a load's measured memory against the header estimate."""
from __future__ import annotations

import asyncio

import pytest

from mindie_service.catalog.fit_estimate import loaded_estimate
from mindie_service.catalog.memory_meter import LoadMeter
from mindie_service.engine.async_engine import AsyncEngine
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.pool_sleep import kv_sleep_problem, sleep_kv, wake_kv
from mindie_service.errors import ConflictError
from mindie_service.inputs import InputProcessor, TextPrompt
from mindie_service.sampling_params import SamplingParams
from npu_ops.memory import rss_bytes


@pytest.fixture(scope="module")
def engine(tiny_model):
    eng = AsyncEngine(EngineConfig(model=str(tiny_model), cache_block_size=16, num_kv_blocks=4096, max_batch_size=4,
                                   max_prefill_batch_size=4))
    eng.start()
    yield eng
    eng.shutdown()


def _greedy(eng: AsyncEngine, prompt: str) -> list[int]:
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    req = InputProcessor.from_facts(eng.input_facts).process(TextPrompt(prompt), params, request_id=prompt)

    async def run() -> list[int]:
        return [ev.token.id async for ev in eng.generate(req)]
    return asyncio.run(run())


def test_level_one_frees_the_pool_and_wakes_to_identical_outputs(engine) -> None:
    prompt = "River mountain city garden river mountain city garden river"  # > 1 block: a prefix-cache entry
    before = _greedy(engine, prompt)
    assert engine.engine.blocks.cached  # the prompt's full blocks are in the prefix cache
    pool = engine.stats().kv_pool_bytes
    assert pool >= 16 << 20
    rss0 = rss_bytes()
    assert sleep_kv(engine.engine) == pool
    freed = rss0 - rss_bytes()
    assert freed >= 0.8 * pool, (freed, pool)  # the pool's pages went back to the system
    assert engine.stats().kv_pool_bytes == 0 and not engine.engine.blocks.cached
    wake_kv(engine.engine)
    assert engine.stats().kv_pool_bytes == pool
    assert _greedy(engine, prompt) == before
    assert _greedy(engine, prompt) == before  # and from the (new) prefix cache


def test_an_engine_with_kept_sessions_or_work_is_refused(engine) -> None:
    class Busy:
        runner = engine.engine.runner

        @staticmethod
        def has_work() -> bool:
            return True
    assert kv_sleep_problem(Busy()) == "it has requests in flight"
    with pytest.raises(ConflictError, match="level 2 frees everything"):
        sleep_kv(Busy())
    assert "no KV pool of its own" in kv_sleep_problem(object())


def test_the_header_estimate_matches_the_measured_load_within_ten_percent(engine, tiny_model) -> None:
    """catalog/fit_estimate.loaded_estimate (weights from the safetensors header + the configured KV pool) against
    catalog/memory_meter's measurement of a real load (RSS around build and warm-up), once the process's first load
    (the ``engine`` fixture) has paid the runtime's one-time start. Margin: 10% of the estimate."""
    cfg = EngineConfig(model=str(tiny_model), cache_block_size=16, num_kv_blocks=2048, max_batch_size=4,
                       max_prefill_batch_size=4, max_seq_len=512, max_input_token_len=256)
    meter = LoadMeter()
    meter.begin()
    eng = AsyncEngine(cfg)
    meter.built()
    eng.start()
    try:
        _greedy(eng, "Hello")
        meter.warmed()
        got = meter.result(eng)
    finally:
        eng.shutdown()
    est = loaded_estimate(tiny_model, cfg)
    assert got.kv_pool == 2048 * 16 * 2 * 4 * 2 * 32 * 4  # blocks x tokens x K,V x layers x kv heads x head dim x f32
    assert abs(got.total - est) <= 0.10 * est, (got.as_json(), est)

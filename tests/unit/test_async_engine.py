"""The async facade: streaming, aborts that free KV blocks, one failing request failing alone."""
from __future__ import annotations

import asyncio
import dataclasses

import pytest

from mindie_service.engine.async_engine import AsyncEngine
from mindie_service.engine.client import EngineClient
from mindie_service.engine.config import EngineConfig
from mindie_service.engine.types import EngineRequest
from mindie_service.errors import GenerationError, ValidationError
from mindie_service.inputs import TextPrompt
from mindie_service.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_model):
    eng = AsyncEngine(EngineConfig(model=str(tiny_model), cache_block_size=4, num_kv_blocks=256, max_batch_size=16,
                                   max_prefill_batch_size=16))
    eng.start()
    yield eng
    eng.shutdown()


def _req(eng: AsyncEngine, rid: str, n: int = 16, prompt: str = "River mountain city garden") -> EngineRequest:
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return eng.input_processor.process(TextPrompt(prompt), params, request_id=rid)


async def _collect(eng: AsyncEngine, req: EngineRequest) -> list[int]:
    return [ev.token.id async for ev in eng.generate(req)]


async def _idle(eng: AsyncEngine) -> None:
    for _ in range(200):
        st = eng.stats()
        if st.running == 0 and st.waiting == 0:
            return
        await asyncio.sleep(0.01)


def test_concurrent_identical_requests_agree(engine):
    async def main():
        return await asyncio.gather(*(_collect(engine, _req(engine, f"same-{i}")) for i in range(4)))
    outs = asyncio.run(main())
    assert len(outs[0]) == 16 and all(o == outs[0] for o in outs)


def test_abandoned_stream_aborts_and_frees_blocks(engine):
    async def main():
        total = engine.stats().total_blocks
        agen = engine.generate(_req(engine, "gone", n=200))
        async for ev in agen:
            if ev.index == 3:
                break
        await agen.aclose()  # what a disconnecting client's handler does
        await _idle(engine)
        return total
    total = asyncio.run(main())
    st = engine.stats()
    assert st.running == 0 and st.waiting == 0
    # Freed blocks may stay in the prefix cache, but none is referenced any more.
    assert sum(1 for r in engine.engine.blocks.ref_counts if r) == 0 and st.free_blocks == total


def test_cancel_before_first_token_frees_blocks(engine):
    async def main():
        task = asyncio.create_task(_collect(engine, _req(engine, "early", n=500, prompt="Lantern " * 200)))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.2)
        await _idle(engine)
    asyncio.run(main())
    assert engine.stats().running == 0 and sum(1 for r in engine.engine.blocks.ref_counts if r) == 0


def test_a_request_that_breaks_the_engine_fails_alone(engine, monkeypatch):
    poison = 1777  # any token id: the patched sampler fails rows whose prompt contains it
    real = engine.engine.sampler.sample

    def sample(logits, seqs):
        if any(poison in s.prompt_token_ids for s in seqs):
            raise RuntimeError("injected fault")
        return real(logits, seqs)

    monkeypatch.setattr(engine.engine.sampler, "sample", sample)

    async def main():
        bad = _req(engine, "bad")
        bad = dataclasses.replace(bad, prompt_token_ids=bad.prompt_token_ids + (poison,))
        return await asyncio.gather(_collect(engine, _req(engine, "ok1")), _collect(engine, bad),
                                    _collect(engine, _req(engine, "ok2")), return_exceptions=True)
    ok1, bad, ok2 = asyncio.run(main())
    # Issue #16: the client learns which request failed, never the internal exception text (that is logged).
    assert isinstance(bad, GenerationError) and "bad" in str(bad) and "injected fault" not in str(bad)
    assert isinstance(ok1, list) and ok1 == ok2 and len(ok1) == 16
    assert engine.healthy()


def test_the_async_engine_is_an_engine_client_with_the_model_facts(engine):
    assert isinstance(engine, EngineClient)
    assert engine.vocab_size == engine.engine.vocab_size and engine.modalities == frozenset()
    assert engine.dtype == "float32" and engine.device_type == "cpu" and engine.device_reason
    assert engine.adapter_names() == [] and engine.list_adapters() == []
    limits = engine.input_processor.limits
    assert limits.max_input_len == min(engine.config.effective_max_input_len, engine.engine.pool_tokens - 1)


def test_processor_limit_follows_the_kv_pool(engine):
    """256 blocks of 4 tokens: a 2048-token maxInputTokenLen is bounded by the pool (1023 tokens)."""
    assert engine.input_processor.limits.max_input_len == 1023
    with pytest.raises(ValidationError, match="at most 1023 tokens"):
        _req(engine, "huge", prompt="river " * 1100)

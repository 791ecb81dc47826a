"""The async facade: streaming, aborts that free KV blocks, one failing request failing alone."""
from __future__ import annotations

import asyncio

import pytest

from mindie_service.engine.async_engine import AsyncEngine
from mindie_service.engine.config import EngineConfig
from mindie_service.engine.types import EngineRequest
from mindie_service.errors import GenerationError
from mindie_service.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_model):
    eng = AsyncEngine(EngineConfig(model=str(tiny_model), cache_block_size=4, num_kv_blocks=256, max_batch_size=16,
                                   max_prefill_batch_size=16))
    eng.start()
    yield eng
    eng.shutdown()


def _req(eng: AsyncEngine, rid: str, n: int = 16, prompt: str = "River mountain city garden") -> EngineRequest:
    return EngineRequest(rid, eng.tokenize(prompt), SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))


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
        bad.prompt_token_ids = bad.prompt_token_ids + [poison]
        return await asyncio.gather(_collect(engine, _req(engine, "ok1")), _collect(engine, bad),
                                    _collect(engine, _req(engine, "ok2")), return_exceptions=True)
    ok1, bad, ok2 = asyncio.run(main())
    assert isinstance(bad, GenerationError) and "injected fault" in str(bad)
    assert isinstance(ok1, list) and ok1 == ok2 and len(ok1) == 16
    assert engine.healthy()

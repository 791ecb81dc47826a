"""The async facade: streaming, aborts that free KV blocks, one failing request failing alone."""
from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest

from mindie_service.engine.async_engine import AsyncEngine
from mindie_service.engine.client import EngineClient
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.contract import EngineRequest
from mindie_service.devkit import faults
from mindie_service.errors import (ConfigError, EngineDeadError, GenerationError, IncompleteGenerationError,
                                   UnhealthyError, ValidationError)
from mindie_service.inputs import InputProcessor, TextPrompt
from mindie_service.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_model):
    eng = AsyncEngine(EngineConfig(model=str(tiny_model), cache_block_size=4, num_kv_blocks=256, max_batch_size=16,
                                   max_prefill_batch_size=16, max_preempt_count=16))
    eng.start()
    yield eng
    eng.shutdown()


def _req(eng: AsyncEngine, rid: str, n: int = 16, prompt: str = "River mountain city garden") -> EngineRequest:
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return InputProcessor.from_facts(eng.input_facts).process(TextPrompt(prompt), params, request_id=rid)


async def _collect(eng: AsyncEngine, req: EngineRequest) -> list[int]:
    return [ev.token.id async for ev in eng.generate(req)]


async def _idle(eng: AsyncEngine) -> None:
    for _ in range(6000):  # a minute at most: a hang guard (it returns as soon as the engine is idle)
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


def test_cancel_before_first_token_frees_blocks(engine, monkeypatch):
    aborted = threading.Event()
    abort = engine.engine.abort_request

    def seen_abort(rid: str) -> bool:
        done = abort(rid)
        if rid == "early":
            aborted.set()
        return done

    monkeypatch.setattr(engine.engine, "abort_request", seen_abort)

    async def main():
        task = asyncio.create_task(_collect(engine, _req(engine, "early", n=500, prompt="Lantern " * 200)))
        await asyncio.sleep(0)  # the task registers its request and waits for its first event
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # the engine thread takes the inbox in order: the request, then its abort (however long that takes)
        assert await asyncio.to_thread(aborted.wait, 60)
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
    limits = InputProcessor.from_facts(engine.input_facts).limits
    assert limits.max_input_len == min(engine.config.effective_max_input_len, engine.engine.pool_tokens - 1)


def test_processor_limit_follows_the_kv_pool(engine):
    """256 blocks of 4 tokens: a 2048-token maxInputTokenLen is bounded by the pool (1023 tokens)."""
    assert InputProcessor.from_facts(engine.input_facts).limits.max_input_len == 1023
    with pytest.raises(ValidationError, match="at most 1023 tokens"):
        _req(engine, "huge", prompt="river " * 1100)


# -- engine-thread death and the fault-injection hook (issue #15) -------------------------------------------------
def _fresh(tiny_model) -> AsyncEngine:
    eng = AsyncEngine(EngineConfig(model=str(tiny_model), cache_block_size=4, num_kv_blocks=256, max_batch_size=16,
                                   max_prefill_batch_size=16, max_preempt_count=16))
    eng.start()
    return eng


def _sampled(eng: AsyncEngine, rid: str, prompt: str, seed: int, n: int = 16) -> EngineRequest:
    params = SamplingParams(max_tokens=n, temperature=0.9, top_k=20, seed=seed, ignore_eos=True)
    return InputProcessor.from_facts(eng.input_facts).process(TextPrompt(prompt), params, request_id=rid)


async def _partial(eng: AsyncEngine, req: EngineRequest, got: list[int]) -> list[int]:
    async for ev in eng.generate(req):
        got.append(ev.token.id)
    return got


def test_engine_death_fails_running_and_inbox_requests_at_once_then_refuses(tiny_model):
    """The step blocks, requests pile up in the inbox, then the engine dies: every stream, started or still
    in the inbox, gets a 500 incomplete_generation long before its 3000 tokens; later requests get a 503."""
    eng = _fresh(tiny_model)
    llm = eng.engine
    real = llm.runner.execute
    blocked, release = threading.Event(), threading.Event()

    def execute(out):
        if any("zqxdieq" in llm.tokenizer.decode(list(llm.scheduler.seqs[c.request_id].prompt_token_ids))
               for c in out.chunks):
            blocked.set()
            release.wait(60)
            raise EngineDeadError("injected: device lost")
        return real(out)

    llm.runner.execute = execute
    try:
        async def main():
            got = {k: [] for k in ("run1", "run2", "inbox1", "inbox2")}
            tasks = {k: asyncio.create_task(_partial(eng, _req(eng, k, n=3000), got[k])) for k in ("run1", "run2")}
            while len(got["run1"]) < 2 or len(got["run2"]) < 2:  # both are generating
                await asyncio.sleep(0.01)
            tasks["killer"] = asyncio.create_task(_collect(eng, _req(eng, "killer", n=4, prompt="Lantern zqxdieq")))
            await asyncio.to_thread(blocked.wait, 60)  # the engine thread is inside the fatal step
            for k in ("inbox1", "inbox2"):
                tasks[k] = asyncio.create_task(_partial(eng, _req(eng, k, n=3000), got[k]))
            await asyncio.sleep(0.05)
            assert len(eng._inbox) == 2  # registered, not yet taken by the engine thread
            release.set()
            # Bounded only so that a request the death forgot fails the test instead of hanging it.
            outs = dict(zip(tasks, await asyncio.wait_for(asyncio.gather(*tasks.values(), return_exceptions=True),
                                                          120)))
            with pytest.raises(UnhealthyError) as late:
                await _collect(eng, _req(eng, "late"))
            return outs, got, late.value
        outs, got, late = asyncio.run(main())
    finally:
        release.set()
        eng.shutdown()
    for k, out in outs.items():
        assert isinstance(out, IncompleteGenerationError), (k, out)
        assert out.status == 500 and out.error_type == "incomplete_generation"
        assert k in out.message and "device lost" not in out.message  # the cause is logged, not sent
    assert len(got["run1"]) < 3000 and len(got["run2"]) < 3000 and got["inbox1"] == got["inbox2"] == []
    assert not eng.healthy() and "device lost" in eng.dead_reason
    assert late.status == 503 and "restarting" in late.message
    assert eng.stats().running >= 0  # stats still answer for /v1/status after the death


def test_injected_step_fault_fails_one_request_others_unchanged(engine, monkeypatch):
    """devkit.faults fail_request: the marked request gets a 424; greedy and seeded neighbours give the very
    tokens of a run without the fault."""
    llm = engine.engine
    prompts = {"g1": "River mountain city garden", "g2": "The lantern by the harbor window"}

    async def run(with_bad: bool):
        reqs = [_req(engine, f"{k}-{with_bad}", prompt=p) for k, p in prompts.items()]
        reqs.append(_sampled(engine, f"s-{with_bad}", "Quiet market morning", seed=1234))
        if with_bad:
            reqs.insert(1, _req(engine, "bad", prompt="Silver zqxfailq winter bridge"))
        return await asyncio.gather(*(_collect(engine, r) for r in reqs), return_exceptions=True)

    clean = asyncio.run(run(False))
    monkeypatch.setattr(llm.runner, "execute", llm.runner.execute)  # restored after the test
    faults.install(llm, faults.FaultPlan.parse("fail_request=zqxfailq"))
    faulty = asyncio.run(run(True))
    bad = faulty.pop(1)
    assert isinstance(bad, GenerationError) and bad.status == 424 and "bad" in bad.message
    assert all(isinstance(o, list) and len(o) == 16 for o in clean)
    assert faulty == clean
    assert engine.healthy()


def test_fault_plan_parsing_refuses_what_it_cannot_do():
    assert faults.FaultPlan.parse("fail_request=@@a@@, kill_engine=@@b@@") == faults.FaultPlan("@@a@@", "@@b@@")
    assert faults.plan_from_env({}) is None and faults.plan_from_env({faults.ENV: " "}) is None
    for bad in ("explode=x", "fail_request=", "fail_request", "fail_request=a,fail_request=b"):
        with pytest.raises(ConfigError, match=faults.ENV):
            faults.FaultPlan.parse(bad)


def test_fault_plan_reaches_every_model_instance_and_skips_the_mock(tiny_model):
    from types import SimpleNamespace

    from mindie_service.devkit.mock_engine import MockEngine

    def llm():
        return SimpleNamespace(runner=SimpleNamespace(execute=lambda out: "ran"), scheduler=SimpleNamespace(seqs={}),
                               tokenizer=None)
    router = SimpleNamespace(engines=[SimpleNamespace(engine=llm()), SimpleNamespace(engine=llm())])
    env = {faults.ENV: "kill_engine=zqxdieq"}
    assert faults.install_from_env(router, env) is router
    empty = SimpleNamespace(chunks=[])
    assert [e.engine.runner.execute(empty) for e in router.engines] == ["ran", "ran"]
    assert all(e.engine.runner.execute.__name__ == "execute" for e in router.engines)  # wrapped, both
    mock = MockEngine(EngineConfig(model=str(tiny_model)))
    assert faults.install_from_env(mock, env) is mock and not hasattr(mock, "engine")
    lone = SimpleNamespace(engine=llm())
    faults.install_from_env(lone, {})  # not set: untouched
    assert lone.engine.runner.execute.__name__ == "<lambda>"

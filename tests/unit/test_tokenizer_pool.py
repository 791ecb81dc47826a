"""BackendConfig.tokenizerProcessNumber sizes a thread pool (tokenizers releases the GIL): that many prompts
tokenize at once; media work has a pool of its own of the same size, so a blocked media pool does not stall
a text request's tokenization."""
from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from mindie_service.config import load_config
from mindie_service.devkit.mock_engine import MockEngine
from mindie_service.inputs import TextPrompt
from mindie_service.sampling_params import SamplingParams
from mindie_service.server.context import ServerContext


def context(tmp_path: Path, workers: int) -> ServerContext:
    cfg = {"ServerConfig": {"httpsEnabled": False},
           "BackendConfig": {"tokenizerProcessNumber": workers, "ModelDeployConfig": {
               "maxSeqLen": 256, "maxInputTokenLen": 128,
               "ModelConfig": [{"modelInstanceType": "StandardMock", "modelName": "mock", "modelWeightPath": "none"}]},
               "ScheduleConfig": {"maxPrefillTokens": 256, "maxIterTimes": 64}}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    config = load_config(tmp_path / "config.json")
    ctx = ServerContext(config)
    engine = MockEngine(config.engine_config())
    engine.start()
    ctx.attach_engine(engine)
    return ctx


def prepare(ctx: ServerContext, rid: str):
    assert ctx.engine is not None
    return ctx.frontend.engine_request(ctx.engine, TextPrompt(f"prompt {rid}"), SamplingParams(max_tokens=4), rid)


def meeting_tokenizer(ctx: ServerContext, parties: int, timeout: float) -> None:
    """A slow tokenizer: each call waits until ``parties`` calls are inside it at once."""
    assert ctx.engine is not None
    real = ctx.frontend.processor(ctx.engine).tokenize
    barrier = threading.Barrier(parties, timeout=timeout)

    def tokenize(text: str) -> list[int]:
        barrier.wait()
        return real(text)

    ctx.frontend.processor(ctx.engine).tokenize = tokenize


def test_two_prompts_tokenize_at_the_same_time_with_two_workers(tmp_path):
    ctx = context(tmp_path, workers=2)
    meeting_tokenizer(ctx, 2, timeout=60)  # only passes if both calls run concurrently

    async def main():
        return await asyncio.gather(prepare(ctx, "a"), prepare(ctx, "b"))
    a, b = asyncio.run(main())
    assert a.request_id == "a" and b.request_id == "b" and a.prompt_token_ids != b.prompt_token_ids


def test_one_worker_tokenizes_one_prompt_at_a_time(tmp_path):
    """The same meeting cannot happen in a pool of one thread: the key sizes the pool."""
    ctx = context(tmp_path, workers=1)
    meeting_tokenizer(ctx, 2, timeout=1)

    async def main():
        return await asyncio.gather(prepare(ctx, "a"), prepare(ctx, "b"), return_exceptions=True)
    outs = asyncio.run(main())
    assert all(isinstance(o, threading.BrokenBarrierError) for o in outs), outs


def test_a_blocked_media_pool_does_not_stall_tokenization(tmp_path):
    ctx = context(tmp_path, workers=2)
    assert ctx.media_executor is not ctx.executor
    assert ctx.media_executor._max_workers == ctx.executor._max_workers == 2  # the stated rule: same size
    release = threading.Event()
    busy = [ctx.media_executor.submit(release.wait, 120) for _ in range(2)]  # every media thread held
    try:
        async def main():
            # Bounded only so that a pool shared with media fails the test instead of hanging it.
            return await asyncio.wait_for(prepare(ctx, "text"), 60)
        req = asyncio.run(main())
        assert req.request_id == "text" and req.prompt_token_ids
        assert not any(f.done() for f in busy)  # the media pool was held the whole time
    finally:
        release.set()


@pytest.mark.parametrize("workers", [1, 3])
def test_the_pool_has_as_many_threads_as_the_key_says(tmp_path, workers):
    ctx = context(tmp_path, workers=workers)
    assert ctx.tokenizer_workers == workers and ctx.executor._max_workers == workers

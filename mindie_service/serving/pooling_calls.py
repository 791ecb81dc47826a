"""Prefill-only calls (embeddings, rerank, score) through the serving core: the model's task checked, one admission
slot (maxLinkNum, as any call), the inputs tokenized in the tokenizer pool under the input-length rule, then one
engine pool request for all of them, within e2eTimeout. A caller that goes away cancels it: its inputs not yet run
are dropped from the engine's pooling queue. A batch line (``batch``: jobs.batch_runner) takes no admission slot
and no timeout but its batch's window, as a generation line does (Frontend.open)."""
from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Sequence

from mindie_service.engine.client import EngineClient
from mindie_service.engine.contract import PoolRequest, PoolResult, check_task
from mindie_service.errors import TimeoutError_
from mindie_service.inputs.pool_inputs import pair_inputs, pool_inputs
from mindie_service.serving.frontend import BATCH_TIMEOUTS, Frontend


async def run_pool(frontend: Frontend, engine: EngineClient, task: str, items: Sequence[Any], *, pairs: bool,
                   request_id: str, t0: float, dimensions: int | None = None, batch: bool = False) -> PoolResult:
    """``items``: texts or token-id lists (``pairs``: (text_1, text_2) tuples); ``task``: "embed" or "score"."""
    check_task(engine.tasks, task, engine.model_name)
    limits = BATCH_TIMEOUTS if batch else frontend.timeouts
    async with contextlib.nullcontext() if batch else frontend.admitted(1, t0):
        facts = engine.input_facts
        inputs = await frontend.run_blocking(pair_inputs if pairs else pool_inputs, facts, items)
        left = limits.e2e - (time.monotonic() - t0)
        try:
            return await asyncio.wait_for(engine.pool(PoolRequest(request_id, inputs, task, dimensions)), left)
        except asyncio.TimeoutError:
            raise TimeoutError_(f"the request did not finish within {limits.e2e_name} = {limits.e2e:g} s") from None

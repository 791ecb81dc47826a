"""Sleep and wake of one catalog model (vLLM's ``POST /sleep?level=1|2`` and ``POST /wake_up``, per model on the
management port). Level 1 frees the KV pool and keeps the weights loaded (engine/pool_sleep.py); level 2 frees
both (the engine is stopped; waking loads it again). A sleeping model takes no request: one that names it wakes it,
as load on demand does (catalog/residency.py)."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from mindie_service.catalog.entry import CatalogEntry
from mindie_service.engine.pool_sleep import sleep_kv, wake_kv
from mindie_service.errors import ConflictError, ValidationError

if TYPE_CHECKING:
    from mindie_service.catalog.residency import Residency

logger = logging.getLogger(__name__)


def _llm_engine(engine: Any) -> Any:
    """The LLMEngine behind a model's client (an AsyncEngine's ``engine``); the client itself otherwise (a mock, or
    a router over several instances: pool_sleep refuses those)."""
    return getattr(engine, "engine", engine)


def check_level(raw: str | None) -> int:
    if raw not in ("1", "2"):
        raise ValidationError(f"Parameter level must be 1 (free the KV pool) or 2 (free the weights too), got {raw!r}")
    return int(raw)


async def sleep(res: "Residency", e: CatalogEntry, level: int) -> None:
    """Put ``e`` to sleep: 409 unless it is running (or asleep at a lower level) and idle."""
    if e.state == "sleeping" and e.sleep_level >= level:
        return
    if e.state == "sleeping" and level == 2:  # level 1 -> 2: the weights go too
        await wake_pool(e)
    if e.state != "running":
        raise ConflictError(f"model {e.id} cannot sleep while {e.state}")
    cat = res.catalog
    with cat.hold_lock():
        if not res.idle(e):
            raise ConflictError(f"model {e.id} has requests in flight; it sleeps once they end (retry)")
        e.state = "sleeping"  # from here on no request reaches its engine: one that names it wakes it
    if level == 1:
        try:
            freed = await asyncio.get_running_loop().run_in_executor(None, sleep_kv, _llm_engine(e.engine))
        except BaseException:
            e.state = "running"
            raise
        logger.info("model %s: running -> sleeping (level 1: KV pool freed, %.1f MiB)", e.id, freed / 2**20)
    else:
        e.state = "running"  # the stop drains from "running"
        cat.stop(e.id)
        while e.state == "stopping":
            await asyncio.sleep(0.02)
        e.state = "sleeping"
        logger.info("model %s: running -> sleeping (level 2: weights and KV pool freed)", e.id)
    e.sleep_level, e.parked = level, True
    e.counters.sleeps += 1


async def wake_pool(e: CatalogEntry) -> None:
    """Wake ``e`` from a level-1 sleep: a fresh KV pool (its weights were kept). A level-2 sleeper is loaded again
    by residency (Residency.bring_up), room made as for any load."""
    await asyncio.get_running_loop().run_in_executor(None, wake_kv, _llm_engine(e.engine))
    e.state, e.sleep_level, e.parked, e.idle_since = "running", 0, False, time.monotonic()
    logger.info("model %s: sleeping -> running (woken: KV pool allocated)", e.id)

"""A level-1 sleep of one engine (vLLM's ``/sleep?level=1``): its KV pool freed while its weights stay loaded, and
a fresh pool on waking. The pool's contents are lost, so the prefix cache is forgotten; an engine whose pool is
shared with parts that outlive the step (a draft model's pool, kept sessions, their spill files, tensor-parallel
ranks) is refused, naming why, rather than half freed. Called only while the engine is idle (the catalog holds the
model asleep: no request reaches it)."""
from __future__ import annotations

import gc
import logging
from typing import Any

from mindie_service.errors import ConflictError

logger = logging.getLogger(__name__)


def kv_sleep_problem(eng: Any) -> str | None:
    """Why ``eng`` (an LLMEngine) cannot free its KV pool alone now; None when it can."""
    if not hasattr(eng, "runner") or not hasattr(eng.runner, "release_pool"):
        return "this engine has no KV pool of its own to free (a mock, or several model instances)"
    if eng.has_work():
        return "it has requests in flight"
    if eng.ranks is not None:
        return "its KV pool is split over tensor-parallel ranks"
    if eng.spec is not None:
        return "its draft model shares the KV budget (speculative decoding)"
    if eng.spill is not None:
        return "its kept sessions spill from the pool (ScheduleConfig.sessionSpillDir)"
    if eng.sessions.stats().held:
        return "kept sessions (/api/* request_id) hold KV blocks"
    return None


def sleep_kv(eng: Any) -> int:
    """Free ``eng``'s KV pool (ConflictError naming why it cannot); the bytes freed."""
    why = kv_sleep_problem(eng)
    if why is not None:
        raise ConflictError(f"level 1 sleep cannot free this model's KV pool: {why} (level 2 frees everything)")
    eng.blocks.forget_cache()
    freed = int(eng.runner.release_pool())
    gc.collect()  # the pool's mapping goes back now
    logger.info("KV pool freed (%.1f MiB)", freed / 2**20)
    return freed


def wake_kv(eng: Any) -> None:
    """A fresh (zeroed) KV pool of the same shape."""
    eng.runner.alloc_pool()
    logger.info("KV pool allocated again (%.1f MiB)", eng.runner.kv_pool_bytes / 2**20)

"""The one door from a request's model name to a running engine: a catalog model, or a LoRA adapter on a running
one, loaded on demand when it is stopped or asleep (catalog/residency.py: one load per model, room made by
unloading idle models, bounded by modelLoadTimeoutSeconds). Every route goes through ``hold_model``."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from mindie_service.engine.client import EngineClient
from mindie_service.errors import NotFoundError

if TYPE_CHECKING:  # the catalog's downloader brings Tornado's HTTP client: the serving core only calls it
    from mindie_service.catalog.catalog import Target
    from mindie_service.catalog.residency import Residency


async def hold_model(residency: "Residency", model: str, keep_alive: float | None = None) -> "Target":
    """``model`` running and held (``catalog.release(target)`` when the request ends): 404 unknown, 424 its load
    failed, 429 no room within the bound, 503 not loadable here. ``keep_alive``: the request's (params/keep_alive.py)."""
    return await residency.acquire(model, keep_alive)


async def engine_for(residency: "Residency | None", model: str, default_model: str,
                     default_engine: Callable[[], EngineClient], loads: bool = True) -> tuple[EngineClient, str | None]:
    """The engine ``model`` names and the adapter, loaded on demand. Without a catalog only ``default_model`` is
    served. The hold is released at once: a batch job is not a request a model stop waits for (its lines fail and
    can be resubmitted; residency never unloads an engine with sequences in it)."""
    if residency is None:
        if model != default_model:
            raise NotFoundError(f"Parameter model must name a served model ({default_model}), got {model!r}")
        return default_engine(), None
    target = await residency.acquire(model, loads=loads)
    residency.catalog.release(target)
    return target.engine, target.adapter_id

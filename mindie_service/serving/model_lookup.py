"""The engine a request's model name picks: a catalog model, or a LoRA adapter on a running one."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from mindie_service.engine.client import EngineClient
from mindie_service.errors import NotFoundError

if TYPE_CHECKING:  # the catalog's downloader brings Tornado's HTTP client: the serving core only calls it
    from mindie_service.catalog.catalog import Catalog


def engine_for(catalog: "Catalog | None", model: str, default_model: str,
               default_engine: Callable[[], EngineClient]) -> tuple[EngineClient, str | None]:
    """The running engine ``model`` names and the adapter: 404 for a name the service does not know, 503 for
    a model that is not running. Without a catalog only ``default_model`` is served. The catalog's hold is
    released at once: a batch job is not a request a model stop waits for (its lines fail and can be resubmitted)."""
    if catalog is None:
        if model != default_model:
            raise NotFoundError(f"Parameter model must name a served model ({default_model}), got {model!r}")
        return default_engine(), None
    target = catalog.resolve(model)
    catalog.release(target)
    return target.engine, target.adapter_id

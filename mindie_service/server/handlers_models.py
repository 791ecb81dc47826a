"""Jan's model routes. The read-only ones (GET /v1/models, GET /v1/models/{id}) on both ports; the ones that change
what is served (DELETE /v1/models/{id}, PUT /v1/models/{id}/start|stop, GET /v1/models/download/{id}) on the
management port only (server/app.py). Shapes: seeds/jan-models.yaml; a failed start's error is the extension
field ``load_error`` (and ``metadata.error``), its state Jan's "stopped" (list: null)."""
from __future__ import annotations

import logging
from typing import Any

from mindie_service.catalog.catalog import Catalog, CatalogEntry
from mindie_service.catalog.checkpoint_kind import detect, expected_kind
from mindie_service.errors import ForbiddenError, MindieError, UnhealthyError
from mindie_service.models.demo_marker import demo_checkpoint
from mindie_service.models.pooling_spec import folder_tasks
from mindie_service.protocol.openai_encoder import openai_error
from mindie_service.server.handlers_base import BaseHandler
from mindie_service.server.handlers_mgmt import (ManagementOnlyHandler, management_only,
                                                 management_only_message)
from mindie_service.server.residency_view import memory_view

logger = logging.getLogger(__name__)

# Model.state of the list's entries (null when neither running nor changing). A running model reads "running" in
# the list as in GetModelResponse (Jan's seed says "ready" in its list enum; one word for one state here).
_LIST_STATE = {"running": "running", "starting": "starting", "stopping": "stopping", "downloading": "downloading",
               "sleeping": "sleeping"}
_DETAIL_STATE = {"failed": "stopped"}  # the seed's enum has no "failed": load_error says why


def _source_url(e: CatalogEntry) -> str:
    """Never a server path: an http(s) source as given, anything local as an opaque ``local:{id}``."""
    u = e.record.source_url
    return u if u.startswith(("http://", "https://")) else f"local:{e.id}"


def model_view(e: CatalogEntry, *, detail: bool) -> dict[str, Any]:
    r = e.record
    meta = dict(r.metadata)
    if e.progress:
        meta["download"] = dict(e.progress)
    if e.error:
        meta["error"] = e.error
    out: dict[str, Any] = {
        "id": e.id, "object": "model", "created": r.created, "owned_by": r.owned_by, "type": "model",
        "version": r.version, "name": r.name or e.id, "description": r.description,
        "state": _DETAIL_STATE.get(e.state, e.state) if detail else _LIST_STATE.get(e.state),
        "format": r.format or detect(e.folder) or expected_kind(r.source_url, r.assets) or "",
        "source_url": _source_url(e), "settings": {k: str(v) for k, v in r.settings.items()},
        "parameters": dict(r.parameters), "metadata": meta, "assets": [a.rsplit("/", 1)[-1] for a in r.assets],
        "parent": None, "root": e.id,
        "demo_weights": demo_checkpoint(e.folder) is not None,  # random weights (devkit.json): gibberish answers
        "tasks": _tasks(e),
        # residency (issue 46): the catalog's own state word (failed, sleeping...), when a request last used it
        "status": e.state, "last_used": None if e.last_used is None else round(e.last_used, 3),
    }
    if e.engine is not None and e.state == "running" and getattr(e.engine, "pooling_info", None):
        out["pooling"] = dict(e.engine.pooling_info)
    if detail:
        out["engine_parameters"] = dict(r.engine_parameters)
        if e.engine is not None:  # what loading did to each tensor kind (a GGUF's ggml types), while it runs
            out["weights_report"] = dict(getattr(e.engine, "weights_report", None) or {})
    if e.state == "failed":
        out["load_error"] = e.error
    return out


def _tasks(e: CatalogEntry) -> list[str]:
    """Extension: what the model serves ("generate", "embed", "score"): its engine's while it runs, else what its
    checkpoint can, narrowed by model.json's task (the config's ModelConfig.task applies once started)."""
    if e.engine is not None and e.state == "running":
        return sorted(e.engine.tasks)
    if e.mock:
        return ["generate"]
    can = folder_tasks(e.folder) if e.folder.is_dir() else None
    if can is None:
        return [e.record.task] if e.record.task else []
    return sorted(can & {e.record.task} if e.record.task else can)


def adapter_view(base: CatalogEntry, a: dict[str, Any]) -> dict[str, Any]:
    """A LoRA adapter as vLLM lists it: its base model as ``parent``."""
    return {"id": a["name"], "object": "model", "created": base.record.created, "owned_by": base.record.owned_by,
            "type": "model", "state": "running", "source_url": f"local:{a['name']}", "parameters": {}, "metadata": {},
            "parent": base.id, "root": base.id, "tasks": ["generate"]}  # adapters apply to generation only


class _CatalogHandler(BaseHandler):
    def error_json(self, err: MindieError) -> Any:
        status, body = openai_error(err)
        self.set_status(status)
        return body

    @property
    def catalog(self) -> Catalog:
        cat = self.ctx.catalog
        if cat is None:
            raise UnhealthyError("the model catalog is still loading")
        return cat


class ModelsHandler(_CatalogHandler):
    """GET /v1/models (ListModelsResponse): every catalog model, then every loaded adapter."""

    def get(self) -> None:
        cat = self.catalog
        cat.scan()
        data = [model_view(e, detail=False) for e in cat.entries.values()]
        for e in cat.entries.values():
            data += [adapter_view(e, a) for a in cat.adapters(e)]
        self.write_json({"object": "list", "data": data})


class ModelViewHandler(_CatalogHandler):
    """GET /v1/models/{id} (GetModelResponse, with the transient states)."""

    def get(self, model_id: str) -> None:
        e = self.catalog.get(model_id)
        self.write_json({**model_view(e, detail=True), "memory": memory_view(e, self.catalog.need_bytes(e))})

    @management_only
    def delete(self, model_id: str) -> None:
        raise ForbiddenError(management_only_message(self))


class ModelHandler(ModelViewHandler):
    """GET /v1/models/{id} (GetModelResponse, with the transient states); DELETE (DeleteModelResponse)."""

    def delete(self, model_id: str) -> None:
        self.catalog.delete(model_id)
        self.write_json({"id": model_id, "object": "model", "deleted": True})


class StartModelHandler(_CatalogHandler):
    """PUT /v1/models/{id}/start: answers once the load began (state "starting"); 409 when it won't fit the memory
    left or is busy; 429 when maxLoadedModels / modelMemoryBudget leave no room (residency, as for a request)."""

    async def put(self, model_id: str) -> None:
        e = self.catalog.get(model_id)
        await self.ctx.residency.start_requested(e)
        self.write_json({"id": e.id, "object": "model", "state": e.state})


class StopModelHandler(_CatalogHandler):
    """PUT /v1/models/{id}/stop: answers at once (state "stopping"); running requests finish first."""

    def put(self, model_id: str) -> None:
        e = self.catalog.stop(model_id)
        self.write_json({"id": e.id, "object": "model", "state": e.state})


class DownloadModelHandler(_CatalogHandler):
    """GET /v1/models/download/{id}: fetch the model's source_url into its folder, in the background."""

    async def get(self, model_id: str) -> None:
        cap = self.ctx.config.backend.max_model_download_mb * 1024 * 1024
        await self.catalog.download(model_id, self.ctx.fetch_policy, cap)
        self.write_json({"message": f"Starting download {model_id}"})


class ManagementOnlyModelHandler(_CatalogHandler, ManagementOnlyHandler):
    """A model route that changes what is served, asked on the business port: 403 (OpenAI's error shape)."""

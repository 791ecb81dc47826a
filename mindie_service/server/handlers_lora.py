"""LoRA adapters over HTTP: load/unload on the management port, the model list on the business port."""
from __future__ import annotations

import logging

from mindie_service.engine.client import EngineClient
from mindie_service.errors import UnhealthyError, check
from mindie_service.server.handlers_base import BaseHandler

logger = logging.getLogger(__name__)


def _adapter_engine(handler: BaseHandler) -> EngineClient:
    if not handler.ctx.ready:
        raise UnhealthyError("the model is still loading")
    return handler.ctx.loaded_engine


class LoadLoraHandler(BaseHandler):
    """POST /v1/load_lora_adapter {"lora_name", "lora_path"}: 200, 409 name taken, 422 bad adapter."""

    async def post(self) -> None:
        body = self.json_body()
        name, path = body.get("lora_name"), body.get("lora_path")
        check(isinstance(name, str) and 0 < len(name) <= 256, "lora_name", "a non-empty string", name)
        check(isinstance(path, str) and len(path) > 0, "lora_path", "a non-empty string", path)
        info = await _adapter_engine(self).load_adapter(name, path)
        logger.info("loaded LoRA adapter %s", name)
        self.write_json({"status": "success", "lora_name": name, "rank": info.get("rank")})


class UnloadLoraHandler(BaseHandler):
    """POST /v1/unload_lora_adapter {"lora_name"}: 200, 404 unknown, 409 while requests use it."""

    def post(self) -> None:
        name = self.json_body().get("lora_name")
        check(isinstance(name, str) and len(name) > 0, "lora_name", "a non-empty string", name)
        _adapter_engine(self).unload_adapter(name)
        logger.info("unloaded LoRA adapter %s", name)
        self.write_json({"status": "success", "lora_name": name})


class ModelsHandler(BaseHandler):
    """GET /v1/models (OpenAI's list): the base model and every loaded adapter."""

    def get(self) -> None:
        ctx = self.ctx
        data = [{"id": ctx.model_name, "object": "model", "owned_by": "mindie-service", "root": ctx.model_name,
                 "parent": None}]
        for a in (ctx.engine.list_adapters() if ctx.engine is not None else []):
            data.append({"id": a["name"], "object": "model", "owned_by": "mindie-service", "root": a.get("path"),
                         "parent": ctx.model_name})
        self.write_json({"object": "list", "data": data})

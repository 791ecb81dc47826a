"""LoRA adapters over HTTP: load/unload on the management port (the business port lists them in /v1/models,
server/handlers_models.py)."""
from __future__ import annotations

import logging
import os

from mindie_service.engine.client import EngineClient
from mindie_service.errors import check
from mindie_service.server.handlers_base import BaseHandler

logger = logging.getLogger(__name__)


def _adapter_engine(handler: BaseHandler) -> EngineClient:
    if not handler.ctx.ready:
        raise handler.ctx.loading_error()
    return handler.ctx.loaded_engine


class LoadLoraHandler(BaseHandler):
    """POST /v1/load_lora_adapter {"lora_name", "lora_path"}: 200, 409 name taken, 422 bad adapter."""

    async def post(self) -> None:
        body = self.json_body()
        name, path = body.get("lora_name"), body.get("lora_path")
        check(isinstance(name, str) and 0 < len(name) <= 256, "lora_name", "a non-empty string", name)
        check(isinstance(path, str) and len(path) > 0, "lora_path", "a non-empty string", path)
        # Like every path of the config, a relative one names a folder beside config.json, whatever the
        # server's working directory.
        path = os.path.normpath(os.path.join(os.path.dirname(self.ctx.config.path), os.path.expanduser(path)))
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

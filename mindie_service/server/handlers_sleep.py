"""vLLM's sleep mode on the management port, per catalog model (``?model=ID``, default: the default model):
POST /sleep?level=1 frees the model's KV pool, level=2 its weights too; POST /wake_up loads what it freed (a
request naming a sleeping model wakes it too); GET /is_sleeping says whether it sleeps and at which level."""
from __future__ import annotations

import logging

from mindie_service.catalog.catalog import CatalogEntry
from mindie_service.catalog.sleep import check_level, sleep
from mindie_service.errors import UnhealthyError
from mindie_service.server.handlers_base import BaseHandler

logger = logging.getLogger(__name__)


class _SleepRoute(BaseHandler):
    """Errors in the management routes' own shape (``{"error", "error_type"}``, as /openapi.json documents them)."""

    def entry(self) -> CatalogEntry:
        if self.ctx.catalog is None or not self.ctx.ready:
            raise UnhealthyError("the model catalog is still loading")
        return self.ctx.catalog.get(self.get_query_argument("model", None) or self.ctx.model_name)

    def answer(self, e: CatalogEntry) -> None:
        self.write_json({"model": e.id, "is_sleeping": e.state == "sleeping", "level": e.sleep_level or None,
                         "state": e.state})


class SleepHandler(_SleepRoute):
    """POST /sleep?level=1|2[&model=ID]."""

    async def post(self) -> None:
        e = self.entry()
        level = check_level(self.get_query_argument("level", "1"))
        await sleep(self.ctx.residency, e, level)
        self.answer(e)


class WakeUpHandler(_SleepRoute):
    """POST /wake_up[?model=ID]: answers once the model serves again."""

    async def post(self) -> None:
        e = self.entry()
        if e.state == "sleeping":
            await self.ctx.residency.bring_up(e)
        self.answer(e)


class IsSleepingHandler(_SleepRoute):
    """GET /is_sleeping[?model=ID]."""

    def get(self) -> None:
        self.answer(self.entry())

"""Management routes moving a kept /api/* session between replicas (ScheduleConfig.sessionSpillDir must be set):

``GET /v1/sessions/{request_id}``  the session's file (engine.sessions.session_file: tokens and KV blocks, versioned,
                                   checksummed, tied to the model), application/octet-stream; 404 when
                                   neither memory nor the spill folder holds it
``PUT /v1/sessions/{request_id}``  keep the file's session here (its KV into free blocks when it is this model's,
                                   else tokens only); the file must name the same request_id (the key the client
                                   continues with is the bearer of the session), at most the size of a
                                   maxSeqLen session and at most maxRequestLength; 422 otherwise

Both answer 409 when sessions are not spilled here (no sessionSpillDir) or the model runs several instances.
The management port's keys and client certificates apply as to its other routes."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from mindie_service.errors import ConflictError, NotFoundError, ValidationError
from mindie_service.server.handlers_base import BaseHandler

logger = logging.getLogger(__name__)

_ADOPT_WAIT_S = 30.0


def spill_of(engine: Any) -> Any:
    """The default model's ``SessionSpill`` (one instance only); ConflictError otherwise."""
    steps = [getattr(e, "engine", None) for e in getattr(engine, "engines", [engine])]
    if len(steps) != 1 or getattr(steps[0], "spill", None) is None:
        raise ConflictError("sessions move between replicas only with ScheduleConfig.sessionSpillDir set and "
                            "modelInstanceNumber 1")
    return steps[0].spill


class SessionHandler(BaseHandler):
    async def get(self, request_id: str) -> None:
        spill = spill_of(await self.ctx.default_engine())
        data = await asyncio.get_running_loop().run_in_executor(None, spill.export, request_id)
        if data is None:
            raise NotFoundError(f"no kept session {request_id!r}")
        self.set_header("Content-Type", "application/octet-stream")
        self.finish(data)

    async def put(self, request_id: str) -> None:
        spill = spill_of(await self.ctx.default_engine())
        from mindie_service.engine.sessions.session_file import decode

        body = self.body()
        f = decode(body, spill.identity, spill.max_bytes)  # ValidationError (422): refused before the engine
        if f.key != request_id:
            raise ValidationError("the session file belongs to another request_id")
        done = spill.import_(body)
        for _ in range(int(_ADOPT_WAIT_S / 0.01)):
            if done.is_set():
                break
            await asyncio.sleep(0.01)
        logger.info("session imported (%d tokens, KV %s)", len(f.tokens), "kept" if f.kv is not None else "refused")
        self.write_json({"request_id": request_id, "tokens": len(f.tokens), "kv": f.kv is not None,
                         "adopted": done.is_set()})

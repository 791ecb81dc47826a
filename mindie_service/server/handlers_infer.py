"""POST /infer: MindIE's native text and stream inference (protocol.mindie_infer)."""
from __future__ import annotations

import dataclasses
from typing import Any

from mindie_service.protocol.encoders import Encoder
from mindie_service.protocol.mindie_infer import DEFAULT_TIMEOUT_S, InferEncoder, parse_infer_request
from mindie_service.protocol.request import GenerationRequest
from mindie_service.server.generation import GenerationHandler
from mindie_service.serving import Submission


class InferHandler(GenerationHandler):
    """POST /infer: MindIE's native route (POST /'s body plus parameters.priority and .timeout)."""

    timeout: float = DEFAULT_TIMEOUT_S

    def parse(self, body: dict[str, Any]) -> GenerationRequest:
        req = parse_infer_request(body, self.ctx.limits)
        self.timeout = req.timeout
        return req.gen

    def submission(self, req: GenerationRequest) -> Submission:
        return dataclasses.replace(super().submission(req), timeout=self.timeout)

    @property
    def encoder(self) -> Encoder:
        enc = self.ctx.mindie_encoder
        return InferEncoder(full_text=enc.full_text, list_ids=enc.list_ids)

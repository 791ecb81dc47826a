"""POST /infer: MindIE's native text and stream inference (MindIE Service docs, "MindIE原生文本/流式推理接口").

The body is POST /'s (``inputs`` as a string or MindIE's list of parts, ``stream``, ``parameters`` with the
same field table: protocol.mindie) plus two parameters of its own:

- ``timeout``: the request's own deadline in seconds, (0, 3600], MindIE's default 600; the call (queueing
  included) ends with a 504 ``timeout`` error when it passes first, or with ServerConfig.e2eTimeout when
  that is sooner.
- ``priority``: MindIE's request priority, [1, 5], lower is more urgent, default 5 (POST / takes it too; its
  mapping onto the scheduler's rank is params.priority's table).

The answer is one JSON object (``/`` answers a one-element list); the stream is ``/``'s frames."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mindie_service.params.ranges import Range
from mindie_service.params.rule import Field, FieldTable, Rule, read_fields
from mindie_service.protocol.mindie import parse_mindie_request
from mindie_service.protocol.request import GenerationRequest, GenerationResult, ProtocolLimits
from mindie_service.protocol.encoders import MindieEncoder
from mindie_service.protocol.validation import require_object

MAX_TIMEOUT_S = 3600  # MindIE: (0, 3600] seconds
DEFAULT_TIMEOUT_S = 600
_INFER: FieldTable = {"timeout": Field("timeout", Rule("int", Range(0, MAX_TIMEOUT_S)))}


@dataclass(frozen=True)
class InferRequest:
    """A validated /infer call: the generation, and its own deadline in seconds."""

    gen: GenerationRequest
    timeout: float = DEFAULT_TIMEOUT_S


def parse_infer_request(body: dict[str, Any], limits: ProtocolLimits) -> InferRequest:
    """``{"inputs", "stream"?, "parameters"?}`` -> InferRequest; ValidationError (422) on bad input."""
    gen = parse_mindie_request(body, limits, extra_keys=frozenset(_INFER))
    extra = read_fields(require_object(body.get("parameters"), "parameters"), _INFER)
    return InferRequest(gen, float(extra.get("timeout", DEFAULT_TIMEOUT_S)))


class InferEncoder(MindieEncoder):
    """/infer: one object ``{"generated_text", "details"?}``; stream frames as ``/`` sends them."""

    def complete(self, req: GenerationRequest, results: list[GenerationResult]) -> Any:
        return self.complete_one(req, results)

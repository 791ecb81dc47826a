"""POST / (MindIE's text and stream inference contract) and POST /v1/tokenizer: parse + validate."""
from __future__ import annotations

from typing import Any

from mindie_service.errors import check
from mindie_service.protocol.generation import GenerationRequest, ProtocolLimits, parse_generation
from mindie_service.protocol.validation import get_bool


def parse_mindie_request(body: dict[str, Any], limits: ProtocolLimits) -> GenerationRequest:
    """``{"inputs", "parameters"?, "stream"?}`` -> GenerationRequest (stream absent or null = false)."""
    stream = bool(get_bool(body, "stream", False))
    return parse_generation(body, dialect="mindie", stream=stream, limits=limits)


def parse_tokenizer_request(body: dict[str, Any]) -> str:
    """POST /v1/tokenizer: ``{"inputs": "..."}`` -> the text to tokenize."""
    v = body.get("inputs")
    check(isinstance(v, str) and len(v) > 0, "inputs", "a non-empty string", v)
    return v

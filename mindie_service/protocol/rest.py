"""The seed REST API (shared/seeds/rest-api-integrations.md): POST /api/generate-one and /api/generate-batch.

Parsing and validation only: every message names the field as the client wrote it
(``prompts[3].request_id``, ``generation_config.num_beams``). The body is JSON whatever its
Content-Type says (the seed's browser example posts ``JSON.stringify`` without one)."""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mindie_service.errors import BadRequestError, ValidationError
from mindie_service.generation_config import GenerationConfig, read_object
from mindie_service.params.rule import read_fields
from mindie_service.params.table import REST
from mindie_service.protocol.validation import reject_constant
from mindie_service.sampling_params import SamplingParams

MAX_BATCH_PROMPTS = 256
MAX_REQUEST_ID_LEN = 256


@dataclass(frozen=True)
class RestPrompt:
    request_id: str  # the client's key: also the session key for continuation
    prompt: str


@dataclass(frozen=True)
class RestRequest:
    """One /api/generate-one (a single prompt) or /api/generate-batch call, validated."""

    prompts: tuple[RestPrompt, ...]
    only_new_tokens: bool
    stream: bool
    config: GenerationConfig

    def params(self) -> SamplingParams:
        return self.config.sampling_params()


def parse_rest_body(body: bytes) -> dict[str, Any]:
    """JSON object from the body (400 malformed, 422 not an object); the Content-Type is not checked."""
    try:
        obj = json.loads(body.decode("utf-8"), parse_constant=reject_constant)
    except UnicodeDecodeError as e:
        raise BadRequestError(f"request body is not valid UTF-8: {e}") from None
    except ValueError as e:
        raise BadRequestError(f"request body is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ValidationError(f"request body must be a JSON object, got {type(obj).__name__}")
    return obj


def _prompt(obj: Any, where: str) -> RestPrompt:
    if not isinstance(obj, dict):
        raise ValidationError(f"Parameter {where or 'body'} must be a JSON object, got {type(obj).__name__}")
    rid, text = obj.get("request_id"), obj.get("prompt")
    if not (isinstance(rid, str) and 0 < len(rid) <= MAX_REQUEST_ID_LEN):
        raise ValidationError(f"Parameter {where}request_id must be a string of 1 to {MAX_REQUEST_ID_LEN} "
                              f"characters, got {_short(rid)}")
    if not isinstance(text, str):
        raise ValidationError(f"Parameter {where}prompt must be a string, got {_short(text)}")
    return RestPrompt(rid, text)


def _short(v: Any) -> str:
    r = repr(v) if not isinstance(v, str) else repr(v[:40] + ("..." if len(v) > 40 else ""))
    return r if v is not None else "none"


def _config(body: Mapping[str, Any], defaults: GenerationConfig) -> GenerationConfig:
    gc = body.get("generation_config")
    if gc is None:
        return defaults.checked()
    if not isinstance(gc, dict):
        raise ValidationError(f"Parameter generation_config must be a JSON object, got {type(gc).__name__}")
    return defaults.merged(read_object(gc, "generation_config.")).checked()


def parse_generate_one(body: Mapping[str, Any], defaults: GenerationConfig) -> RestRequest:
    """``{request_id, prompt, only_new_tokens=true, stream_response=true, generation_config}``."""
    v = read_fields(body, REST)
    return RestRequest((_prompt(body, ""),), v.get("only_new_tokens", True), v.get("stream_response", True),
                       _config(body, defaults))


def parse_generate_batch(body: Mapping[str, Any], defaults: GenerationConfig) -> RestRequest:
    """``{prompts: [{request_id, prompt}], only_new_tokens=true, generation_config}``; never streamed."""
    items = body.get("prompts")
    if not isinstance(items, list) or not items:
        raise ValidationError(f"Parameter prompts must be a non-empty list of {{request_id, prompt}} objects, "
                              f"got {_short(items)}")
    if len(items) > MAX_BATCH_PROMPTS:
        raise ValidationError(f"Parameter prompts must hold at most {MAX_BATCH_PROMPTS} prompts, got {len(items)}")
    prompts = tuple(_prompt(p, f"prompts[{i}].") for i, p in enumerate(items))
    seen: dict[str, int] = {}
    for i, p in enumerate(prompts):
        if p.request_id in seen:
            raise ValidationError(f"Parameter prompts[{i}].request_id must be unique in the batch, got "
                                  f"{_short(p.request_id)} (also prompts[{seen[p.request_id]}].request_id)")
        seen[p.request_id] = i
    if "stream_response" in body and body["stream_response"]:
        raise ValidationError("Parameter stream_response must be false or absent on /api/generate-batch "
                              "(the batch answers one JSON list), got True")
    return RestRequest(prompts, read_fields(body, REST).get("only_new_tokens", True), False, _config(body, defaults))

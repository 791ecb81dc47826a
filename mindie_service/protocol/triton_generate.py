"""Triton's generate extension (Triton Inference Server docs, protocol/extension_generate.md), as MindIE
serves it: ``POST /v2/models/{name}[/versions/{v}]/generate`` and ``/generate_stream``.

Request ``{"id"?, "text_input", "parameters"?}``; ``parameters`` are MindIE's sampling fields (the field
table of POST /, protocol.mindie). Answer ``{"id"?, "model_name", "model_version", "text_output"}`` (plus
``details`` when asked); the stream sends that object per token as SSE ``data:`` frames, ``text_output``
the token's text. Errors are Triton's ``{"error": "..."}``, an error after the stream started its last frame."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mindie_service.engine.contract import TokenEvent
from mindie_service.errors import MindieError, NotFoundError, check
from mindie_service.protocol.encoders import Encoder, StreamState, sse
from mindie_service.protocol.mindie import parse_generation
from mindie_service.protocol.request import GenerationRequest, GenerationResult, ProtocolLimits
from mindie_service.protocol.validation import refuse_unknown, require_object

MODEL_VERSION = "1"  # the one version each model has here
_BODY_KEYS = frozenset({"id", "text_input", "parameters"})


@dataclass(frozen=True)
class ModelRef:
    """The model and version a /v2/models/... path names."""

    name: str
    version: str = MODEL_VERSION


def resolve_model(name: str, version: str | None, served: str) -> ModelRef:
    """The served model ``name`` (and ``version``) names, or NotFoundError (404)."""
    if name != served:
        raise NotFoundError(f"Request for unknown model: '{name}' is not found (this server serves '{served}')")
    if version not in (None, "", MODEL_VERSION):
        raise NotFoundError(f"Request for unknown model: '{name}' version {version} is not found "
                            f"(version {MODEL_VERSION} is served)")
    return ModelRef(name)


def request_id(body: dict[str, Any]) -> str | None:
    """The optional ``id`` echoed in the answer (a string)."""
    v = body.get("id")
    check(v is None or isinstance(v, str), "id", "a string", v)
    return v


def parse_generate_request(body: dict[str, Any], limits: ProtocolLimits, *, stream: bool) -> GenerationRequest:
    """``{"id"?, "text_input", "parameters"?}`` -> GenerationRequest (the route decides streaming). Triton reads
    any other top-level key as a model input: none exists here, so it is refused by name, as is a parameter
    outside POST /'s table (and ``priority``)."""
    refuse_unknown(body, _BODY_KEYS)
    text = body.get("text_input")
    check(isinstance(text, str) and len(text) > 0, "text_input", "a non-empty string", text)
    params = require_object(body.get("parameters"), "parameters")
    return parse_generation({"inputs": text, "parameters": params}, dialect="mindie", stream=stream, limits=limits,
                            priority="triton", extra_keys=frozenset())


def triton_error(err: MindieError) -> dict[str, str]:
    """Triton's error body."""
    return {"error": err.message}


class TritonEncoder(Encoder):
    """One per call: its model, version and the client's ``id``."""

    mindie = True  # details as MindIE's (prompt_tokens, seed)

    def __init__(self, model: ModelRef, rid: str | None, *, full_text: bool = False) -> None:
        super().__init__(full_text=full_text)
        self.model, self.rid = model, rid

    def _head(self) -> dict[str, Any]:
        head: dict[str, Any] = {"id": self.rid} if self.rid is not None else {}
        return {**head, "model_name": self.model.name, "model_version": self.model.version}

    def complete(self, req: GenerationRequest, results: list[GenerationResult]) -> Any:
        one = self.complete_one(req, results)
        out = {**self._head(), "text_output": one["generated_text"]}
        if "details" in one:
            out["details"] = one["details"]
        return out

    def stream_frame(self, req: GenerationRequest, ev: TokenEvent, result: GenerationResult,
                     state: StreamState) -> bytes:
        state.text += ev.text_delta
        frame = {**self._head(), "text_output": state.text if self.full_text else ev.text_delta}
        if ev.finish_reason is not None and req.details:
            frame["details"] = {"finish_reason": ev.finish_reason, "generated_tokens": len(result.tokens),
                                "prompt_tokens": result.num_prompt_tokens, "seed": result.seed}
        return sse(frame)

    def error_json(self, err: MindieError) -> dict[str, Any]:
        return triton_error(err)

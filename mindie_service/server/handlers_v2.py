"""The /v2 routes: Triton's generate extension (protocol.triton_generate) and the Open Inference Protocol v2
(protocol.oip). Every error is ``{"error": "..."}``, the shape both protocols use."""
from __future__ import annotations

from typing import Any

from mindie_service.errors import MindieError, UnhealthyError
from mindie_service.protocol.encoders import Encoder
from mindie_service.protocol.oip_binary import binary_answer, read_binary_request
from mindie_service.protocol.oip import OipRequest, infer_response, model_metadata, parse_infer, server_metadata
from mindie_service.protocol.request import GenerationRequest
from mindie_service.params.keep_alive import take_keep_alive
from mindie_service.protocol.validation import parse_json_body
from mindie_service.protocol.triton_generate import (ModelRef, TritonEncoder, parse_generate_request, request_id,
                                                     resolve_model, triton_error)
from mindie_service.server.generation import GenerationHandler, StreamingHandler
from mindie_service.server.handlers_base import BaseHandler
from mindie_service.serving import Submission


class V2Errors:
    """Mixin: errors in the /v2 shape."""

    def error_json(self, err: MindieError) -> Any:
        return triton_error(err)


class TritonGenerateHandler(V2Errors, GenerationHandler):
    """POST /v2/models/{name}[/versions/{v}]/generate: Triton's generate extension, one JSON object."""

    stream = False
    model: ModelRef
    rid: str | None = None

    async def post(self, name: str, version: str | None = None) -> None:  # type: ignore[override]
        self.model = resolve_model(name, version, self.ctx.model_name)
        await super().post()

    def parse(self, body: dict[str, Any]) -> GenerationRequest:
        self.rid = request_id(body)
        return parse_generate_request(body, self.ctx.limits, stream=self.stream)

    @property
    def encoder(self) -> Encoder:
        return TritonEncoder(self.model, self.rid, full_text=self.ctx.mindie_encoder.full_text)


class TritonGenerateStreamHandler(TritonGenerateHandler):
    """POST /v2/models/{name}[/versions/{v}]/generate_stream: the same objects as Server-Sent Events."""

    stream = True


class ServerMetadataHandler(V2Errors, BaseHandler):
    """GET /v2: the server's metadata (OIP)."""

    def get(self) -> None:
        from mindie_service.server.handlers_tgi import service_version

        self.write_json(server_metadata(service_version()))


class ModelMetadataHandler(V2Errors, BaseHandler):
    """GET /v2/models/{name}[/versions/{v}]: the model's inputs and outputs (OIP)."""

    def get(self, name: str, version: str | None = None) -> None:
        self.write_json(model_metadata(resolve_model(name, version, self.ctx.model_name)))


class ModelReadyHandler(V2Errors, BaseHandler):
    """GET /v2/models/{name}[/versions/{v}]/ready: 200 when the model serves, else 503 (OIP)."""

    def get(self, name: str, version: str | None = None) -> None:
        resolve_model(name, version, self.ctx.model_name)
        if not self.ctx.ready or not self.ctx.healthy() or self.ctx.draining:
            raise UnhealthyError(f"model '{name}' is not ready")
        self.set_status(200)
        self.finish()


class OipInferHandler(V2Errors, StreamingHandler):
    """POST /v2/models/{name}[/versions/{v}]/infer: text_input or input_ids in, text_output out (OIP)."""

    async def post(self, name: str, version: str | None = None) -> None:
        model = resolve_model(name, version, self.ctx.model_name)
        with self.frontend.tally() as tally:
            tally.ok = await self.serve(self._infer(model, tally.t0))

    def _body(self) -> tuple[OipRequest, float | None]:
        header = self.request.headers.get("Inference-Header-Content-Length")
        if header is not None:  # the binary tensor extension (tritonclient's default for inputs)
            body = read_binary_request(self.body(), header)
        else:  # tritonclient sends its JSON body with no Content-Type: JSON is this route's only body
            body = parse_json_body(self.body(), self.request.headers.get("Content-Type") or "application/json")
        keep_alive = take_keep_alive(body)  # Ollama's keep_alive, as on every generation route
        return parse_infer(body, self.ctx.limits), keep_alive

    async def _infer(self, model: ModelRef, t0: float) -> bool:
        req, keep_alive = await self.ctx.run_blocking(self._body)
        await self.hold_model(None, keep_alive)  # the default model, loaded on demand
        g = req.gens[0]
        sub = Submission([x.prompt for x in req.gens], g.params, self.held_engine,
                         [f"{self.engine_id}.{k}" for k in range(len(req.gens))], truncate=g.truncate, rank=g.rank)
        async with self.frontend.open(sub, t0) as run:
            self.run = run
            answer = infer_response(model, req, await run.results())
            self._answer(answer, binary_answer(answer, req.binary))
        return True

    def _answer(self, answer: dict[str, Any], binary: tuple[bytes, int] | None) -> None:
        if binary is None:
            self.write_json(answer)
            return
        body, header_len = binary  # Triton's binary extension: a JSON header, then the outputs' bytes
        self.set_header("Content-Type", "application/octet-stream")
        self.set_header("Inference-Header-Content-Length", str(header_len))
        self.finish(body)


__all__ = ["ModelMetadataHandler", "ModelReadyHandler", "OipInferHandler", "ServerMetadataHandler",
           "TritonGenerateHandler", "TritonGenerateStreamHandler"]

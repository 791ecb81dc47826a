"""GET /openapi.json: an OpenAPI 3.1 document of the routes a listener serves, built from PLANE_ROUTES (so
it cannot list a route that is not served, nor miss one) with each handler's methods and docstring; the
request and response schemas of the OpenAI and model routes, and every route's error shape."""
from __future__ import annotations

import copy
import re
from typing import Any

import tornado.web

from mindie_service.catalog.model_json import LIST_STATES, TRANSIENT_STATES
from mindie_service.params.keep_alive import OPENAPI_SCHEMA as KEEP_ALIVE_SCHEMA
from mindie_service.protocol.anthropic_encoder import OPENAPI_SCHEMAS as MESSAGES_SCHEMAS
from mindie_service.protocol.anthropic_encoder import OPENAPI_SHAPES as MESSAGES_SHAPES
from mindie_service.protocol.batch_openapi import MULTIPART
from mindie_service.protocol.batch_openapi import OPENAPI_SCHEMAS as BATCH_SCHEMAS
from mindie_service.protocol.batch_openapi import OPENAPI_SHAPES as BATCH_SHAPES
from mindie_service.protocol.oip_openapi import OPENAPI_SCHEMAS as V2_SCHEMAS
from mindie_service.protocol.oip_openapi import OPENAPI_SHAPES as V2_SHAPES
from mindie_service.protocol.pooling_api import OPENAPI_SCHEMAS as POOLING_SCHEMAS
from mindie_service.protocol.pooling_api import OPENAPI_SHAPES as POOLING_SHAPES
from mindie_service.protocol.tokenization import OPENAPI_SCHEMAS as TOKENIZER_SCHEMAS
from mindie_service.protocol.triton_generate import MODEL_VERSION
from mindie_service.protocol.tokenization import OPENAPI_SHAPES as TOKENIZER_SHAPES
from mindie_service.server.auth import OPEN_PATHS
from mindie_service.server.handlers_base import BaseHandler

METHODS = ("get", "post", "put", "delete", "patch")
_OBJ = {"type": "object"}
_ANY: dict[str, Any] = {}
_LOAD_ERROR = {"type": "string", "description": "Extension: present when the model's last start failed (its "
               "state is then Jan's stopped, or null in a list); the reason. It can be started again."}

_GRAMMAR = {"type": ["object", "null"], "required": ["type", "value"], "x-extension": True,
            "properties": {"type": {"enum": ["json", "regex"]}, "value": {}},
            "description": "Extension of the TGI 1.1 document (TGI 1.4's shape): the output matches a JSON Schema "
                           "(value: the schema, or its JSON text) or a regular expression. Compact JSON."}
_KEEP_ALIVE = KEEP_ALIVE_SCHEMA  # Ollama's keep_alive on every route that serves a model (params/keep_alive.py)
_RESPONSE_FORMAT = {"type": "object", "required": ["type"], "properties": {
    "type": {"enum": ["text", "json_object", "json_schema", "json", "regex"]}, "json_schema": _OBJ, "value": {}},
    "description": "OpenAI's response_format (text, json_object, json_schema {name, schema, strict}); TGI's chat "
                   "form {type: json, value: schema} too. Compact JSON; a cap hit first may cut it (finish length)."}
_TOOLS = {"type": "array", "items": {"type": "object", "required": ["type", "function"]}}
_PRIORITY = {"type": "integer", "description": "vLLM's request priority: lower runs first, 0 the default"}
_DEMO = {"type": "boolean", "description": "Extension: the checkpoint holds the random weights of a demo model "
                                           "(mindie-service demo-model): its answers are gibberish."}
_TASKS = {"type": "array", "items": {"enum": ["generate", "embed", "score"]},
          "description": "Extension: what the model serves: generate (completions, chat, ...), embed (/v1/embeddings), "
                         "score (/rerank, /v1/rerank, /score); a running model's engine says, else its checkpoint."}
_POOLING = {"type": "object", "description": "Extension, while a model that embeds runs: its pooling (last, mean or "
                                            "cls), normalize, and matryoshka_dimensions (false, true or the widths)."}

SCHEMAS: dict[str, Any] = {
    "Error": {"type": "object", "required": ["error"], "properties": {
        "error": {"type": "string"}, "error_type": {"type": "string"}},
        "description": "MindIE and TGI routes: {error, error_type}."},
    "OpenAIError": {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"], "properties": {
            "message": {"type": "string"}, "type": {"type": "string"},
            "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
        "description": "OpenAI and model routes: OpenAI's error object."},
    "Model": {"type": "object", "required": ["id", "object", "created", "owned_by"], "properties": {
        "id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
        "owned_by": {"type": "string"}, "parent": {"type": ["string", "null"]},
        "source_url": {"type": "string"}, "parameters": _OBJ, "metadata": _OBJ,
        "state": {"enum": [None, "downloading", "running", "starting", "stopping"],
                  "description": "Jan's Model.state, a running model's as GetModelResponse says it (Jan's list "
                                 "says ready)."}, "load_error": _LOAD_ERROR, "demo_weights": _DEMO,
        "tasks": _TASKS, "pooling": _POOLING}},
    "ListModelsResponse": {"type": "object", "required": ["object", "data"], "properties": {
        "object": {"const": "list"}, "data": {"type": "array", "items": {"$ref": "#/components/schemas/Model"}}}},
    "GetModelResponse": {"type": "object", "required": ["id", "object", "created", "owned_by", "state",
                                                        "source_url", "parameters", "metadata"], "properties": {
        "id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
        "owned_by": {"type": "string"}, "source_url": {"type": "string"}, "parameters": _OBJ, "metadata": _OBJ,
        "engine_parameters": _OBJ, "format": {"type": "string", "description": "safetensors, gguf or ggufv3"},
        "demo_weights": _DEMO, "tasks": _TASKS, "pooling": _POOLING,
        "weights_report": {"type": "object", "additionalProperties": {"type": "string"}, "description":
                           "Extension, while the model runs: what loading did to each tensor kind (a GGUF's "
                           "ggml types: kept, kept packed, converted, dequantized at load) and to each quantized "
                           "GGUF tensor by name."},
        "state": {"enum": list(LIST_STATES + TRANSIENT_STATES),
                  "description": "Jan's four states; downloading, starting and stopping (while they last) are "
                                 "this service's extension."}, "load_error": _LOAD_ERROR}},
    "ModelStateResponse": {"type": "object", "required": ["id", "object", "state"], "properties": {
        "id": {"type": "string"}, "object": {"const": "model"}, "state": {"type": "string"}},
        "description": "StartModelResponse / StopModelResponse."},
    "DeleteModelResponse": {"type": "object", "required": ["id", "object", "deleted"], "properties": {
        "id": {"type": "string"}, "object": {"const": "model"}, "deleted": {"type": "boolean"}}},
    "DownloadModelResponse": {"type": "object", "required": ["message"], "properties": {"message": {"type": "string"}}},
    "CompletionRequest": {"type": "object", "required": ["model", "prompt"], "properties": {
        "keep_alive": _KEEP_ALIVE, "model": {"type": "string"}, "prompt": {"oneOf": [{"type": "string"}, {"type": "array"}]},
        "max_tokens": {"type": ["integer", "null"], "minimum": 0,
                       "description": "0 only with echo: true (scores the prompt: its logprobs, no completion)"},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}, "n": {"type": "integer", "minimum": 1,
                                                                                "maximum": 16},
        "stream": {"type": "boolean"}, "logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 5},
        "echo": {"type": "boolean"}, "stop": {"oneOf": [{"type": "string"}, {"type": "array"}]},
        "seed": {"type": "integer", "minimum": 0}, "user": {"type": "string"}, "response_format": _RESPONSE_FORMAT,
        "priority": _PRIORITY}},
    "ChatCompletionRequest": {"type": "object", "required": ["messages"], "properties": {
        "keep_alive": _KEEP_ALIVE,
        "model": {"type": "string", "description": "absent, \"tgi\" or \"dummy\" (TGI clients): the default model"},
        "messages": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["role", "content"], "properties": {
                "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
                "content": {"oneOf": [{"type": "string"}, {"type": "array"}]}}}},
        "max_tokens": {"type": ["integer", "null"], "minimum": 1},
        "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2}, "stream": {"type": "boolean"},
        "logprobs": {"type": "boolean"}, "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
        "response_format": _RESPONSE_FORMAT, "tools": _TOOLS,
        "tool_choice": {"oneOf": [{"enum": ["none", "auto", "required"]}, _OBJ]},
        "parallel_tool_calls": {"type": "boolean"},
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
        "store": {"type": "boolean", "description": "false only: completions are not stored yet"},
        "service_tier": {"enum": ["auto", "default"]},
        "reasoning_effort": {"enum": ["none", "minimal", "low", "medium", "high"]},
        "thinking_token_budget": {"type": "integer", "minimum": 0, "description": "thinking tokens before </think>"},
        "chat_template_kwargs": {"type": "object", "description": "chat-template variables (enable_thinking)"},
        "verbosity": {"const": "medium"}, "modalities": {"const": ["text"]},
        "prompt_cache_key": {"type": "string", "description": "routing hint across instances; logged"},
        "safety_identifier": {"type": "string", "description": "the end user, logged"},
        "functions": {"type": "array", "items": _OBJ}, "function_call": {"oneOf": [{"enum": ["none", "auto"]}, _OBJ]},
        "priority": _PRIORITY,
        "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"},
                                                            "include_obfuscation": {"type": "boolean"},
                                                            "continuous_usage_stats": {"type": "boolean"}}}}},
    "GenerateRequest": {"type": "object", "required": ["inputs"], "properties": {
        "keep_alive": _KEEP_ALIVE,
        "inputs": {"oneOf": [{"type": "string"}, {"type": "array"}]},
        "parameters": {"type": "object", "properties": {"grammar": _GRAMMAR, "priority": {
            "type": "integer", "minimum": 1, "maximum": 5, "description": "POST / only: 1 most urgent, 5 the default"}}}},
        "description": "MindIE POST / and TGI /generate, /generate_stream: {inputs, parameters}."},
    "Completion": {"type": "object", "required": ["id", "object", "created", "model", "choices"], "properties": {
        "id": {"type": "string"}, "object": {"enum": ["text_completion", "chat.completion"]},
        "created": {"type": "integer"}, "model": {"type": "string"}, "choices": {"type": "array"},
        "usage": {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"]}},
        "description": "Non-stream body; with stream: true, text/event-stream chunks ending with data: [DONE]."},
    "ResponseCreateRequest": {"type": "object", "required": ["input"], "properties": {
        "keep_alive": _KEEP_ALIVE,
        "model": {"type": "string", "description": "absent: the default model"},
        "input": {"oneOf": [{"type": "string"}, {"type": "array", "items": _OBJ}]},
        "instructions": {"type": ["string", "null"]}, "max_output_tokens": {"type": ["integer", "null"], "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2}, "stream": {"type": "boolean"},
        "background": {"type": "boolean"}, "store": {"type": "boolean"}, "tools": {"type": "array", "items": _OBJ},
        "previous_response_id": {"type": ["string", "null"]}, "text": _OBJ,
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}}, "priority": _PRIORITY},
        "description": "OpenAI's Responses create body (function tools only)."},
    "Response": {"type": "object", "required": ["id", "object", "status", "output"], "properties": {
        "id": {"type": "string"}, "object": {"const": "response"}, "status": {"enum": [
            "queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]},
        "output": {"type": "array", "items": _OBJ}, "usage": {"type": ["object", "null"]}},
        "description": "OpenAI's Response; with stream: true, text/event-stream typed events (sequence_number)."},
    "ResponseDeleted": {"type": "object", "required": ["id", "object", "deleted"], "properties": {
        "id": {"type": "string"}, "object": {"const": "response"}, "deleted": {"const": True}}},
    "ResponseItemList": {"type": "object", "required": ["object", "data", "has_more"], "properties": {
        "object": {"const": "list"}, "data": {"type": "array", "items": _OBJ}, "has_more": {"type": "boolean"},
        "first_id": {"type": ["string", "null"]}, "last_id": {"type": ["string", "null"]}}},
    "StoredCompletionUpdate": {"type": "object", "required": ["metadata"], "additionalProperties": False,
                               "properties": {"metadata": {"type": "object",
                                                           "additionalProperties": {"type": "string"}}}},
    "StoredCompletionDeleted": {"type": "object", "required": ["id", "object", "deleted"], "properties": {
        "id": {"type": "string"}, "object": {"const": "chat.completion.deleted"}, "deleted": {"const": True}}},
    **TOKENIZER_SCHEMAS,
    **POOLING_SCHEMAS,
    **MESSAGES_SCHEMAS,
    **V2_SCHEMAS,
    **BATCH_SCHEMAS,
}

# path -> method -> (request schema, 200 schema); routes not listed take and give any JSON.
_SHAPES: dict[str, dict[str, tuple[str | None, str | None]]] = {
    "/v1/completions": {"post": ("CompletionRequest", "Completion")},
    "/": {"post": ("GenerateRequest", None)},
    "/generate": {"post": ("GenerateRequest", None)},
    "/generate_stream": {"post": ("GenerateRequest", None)},
    "/v1/chat/completions": {"post": ("ChatCompletionRequest", "Completion"), "get": (None, "ResponseItemList")},
    "/v1/chat/completions/{id}": {"get": (None, "Completion"), "post": ("StoredCompletionUpdate", "Completion"),
                                  "delete": (None, "StoredCompletionDeleted")},
    "/v1/chat/completions/{id}/messages": {"get": (None, "ResponseItemList")},
    "/v1/models": {"get": (None, "ListModelsResponse")},
    "/v1/models/{id}": {"get": (None, "GetModelResponse"), "delete": (None, "DeleteModelResponse")},
    "/v1/models/{id}/start": {"put": (None, "ModelStateResponse")},
    "/v1/models/{id}/stop": {"put": (None, "ModelStateResponse")},
    "/v1/models/download/{id}": {"get": (None, "DownloadModelResponse")},
    "/v1/responses": {"post": ("ResponseCreateRequest", "Response")},
    "/v1/responses/{id}": {"get": (None, "Response"), "delete": (None, "ResponseDeleted")},
    "/v1/responses/{id}/cancel": {"post": (None, "Response")},
    "/v1/responses/{id}/input_items": {"get": (None, "ResponseItemList")},
    **TOKENIZER_SHAPES,
    **POOLING_SHAPES,
    **MESSAGES_SHAPES,
    **V2_SHAPES,
    **BATCH_SHAPES,
}
OPENAI_ERRORS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/responses", "/v1/files",
                 "/v1/batches", *TOKENIZER_SHAPES, *POOLING_SHAPES)


_PATH_PARAMS = ("id", "version")  # a route's capture groups, in order (/v2/models/{id}/versions/{version})


def openapi_path(pattern: str) -> str:
    """A route's regex as an OpenAPI path: its capture groups are ``{id}``, then ``{version}``."""
    names = iter(_PATH_PARAMS)
    return re.sub(r"\([^)]*\)", lambda m: "{" + next(names) + "}", pattern)


def handler_methods(cls: type) -> list[str]:
    """The HTTP methods ``cls`` implements (tornado's RequestHandler answers the others with 405)."""
    out = []
    for m in METHODS:
        impl = getattr(cls, m, None)
        if impl is not None and impl is not getattr(tornado.web.RequestHandler, m, None) \
                and not getattr(impl, "management_only", False):  # a refusal (403) on this port
            out.append(m)
    return out


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _operation(path: str, method: str, cls: type) -> dict[str, Any]:
    doc = (cls.__doc__ or cls.__name__).strip().splitlines()[0]
    req, ok = _SHAPES.get(path, {}).get(method, (None, None))
    err = _ref("AnthropicError" if path in MESSAGES_SHAPES else "V2Error" if path.startswith("/v2") else
               "OpenAIError" if path.startswith(OPENAI_ERRORS) else "Error")
    content = {"application/json": {"schema": _ref(ok) if ok else _ANY}}
    if ok in ("Completion", "Message", "Response"):
        content["text/event-stream"] = {"schema": {"type": "string"}}
    if path == "/v1/files/{id}/content":
        content = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
        ok = "bytes"
    if path.startswith("/v2/") and path.endswith("/infer"):  # Triton's binary extension, when asked for
        content["application/octet-stream"] = {"schema": {"type": "string", "format": "binary"}}
    if path.endswith("/generate_stream"):  # events whose data is a TritonGenerateResponse (or, last, a V2Error)
        content["text/event-stream"] = {"schema": {"type": "object", "required": ["data"],
                                                   "properties": {"data": {"type": "string"}}}}
    op: dict[str, Any] = {
        "summary": doc, "operationId": f"{method}_{re.sub(r'[^A-Za-z0-9]+', '_', path).strip('_') or 'root'}",
        "responses": {"200": {"description": "OK", **({"content": content} if ok else {})},
                      "default": {"description": "An error", "content": {"application/json": {"schema": err}}}}}
    if "{id}" in path:
        op["parameters"] = [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
                            for n in _PATH_PARAMS if "{" + n + "}" in path]
    if method in ("post", "put") and (req or method == "post"):
        media = "multipart/form-data" if req in MULTIPART else "application/json"
        op["requestBody"] = {"required": method == "post", "content": {media: {"schema": _ref(req) if req else _OBJ}}}
    return op


def build_document(routes: list[tuple[str, type]], version: str, model_ids: list[str] | None = None) -> dict[str, Any]:
    paths: dict[str, Any] = {"/openapi.json": {"get": {"summary": "This document.", "operationId": "get_openapi",
                                                       "responses": {"200": {"description": "OK"}}}}}
    for pattern, cls in routes:
        path = openapi_path(pattern)
        if path in paths:
            continue
        paths[path] = {m: _operation(path, m, cls) for m in handler_methods(cls)}
    schemas = SCHEMAS
    if model_ids:  # examples of `model` that exist, so that clients (and fuzzers) reach past the 404
        schemas = copy.deepcopy(SCHEMAS)
        for name in ("CompletionRequest", "ChatCompletionRequest", "MessagesRequest", "CountTokensRequest",
                     "ResponseCreateRequest", "EmbeddingsRequest", "RerankRequest", "ScoreRequest"):
            schemas[name]["properties"]["model"]["examples"] = list(model_ids)
        for path, ops in paths.items():
            for op in ops.values():
                for prm in op.get("parameters", []):
                    values = model_ids if prm["name"] == "id" else [MODEL_VERSION]
                    prm["examples"] = {m: {"value": m} for m in values}
    return {"openapi": "3.1.0", "info": {"title": "mindie-service", "version": version},
            "paths": paths, "components": {"schemas": schemas}}


class OpenApiHandler(BaseHandler):
    """GET /openapi.json: the routes of this listener."""

    def initialize(self, ctx: Any, routes: list[tuple[str, type]] | None = None) -> None:  # type: ignore[override]
        super().initialize(ctx)
        self.routes = routes or []

    def get(self) -> None:
        from mindie_service.server.handlers_tgi import service_version

        cat = self.ctx.catalog
        doc = build_document(self.routes, service_version(), list(cat.entries) if cat else None)
        auth = self.application.settings.get("auth")
        if auth is not None and auth.ring.asks(self.application.settings.get("default_plane", "business")):
            add_bearer(doc)
        self.write_json(doc)


def add_bearer(doc: dict[str, Any]) -> None:
    """This port asks for API keys: every operation but the open probes (server/auth.OPEN_PATHS) says so."""
    doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, ops in doc["paths"].items():
        for op in ops.values():
            op["security"] = [] if path in OPEN_PATHS else [{"bearer": []}]

"""The OpenAPI schemas of POST /infer, Triton's generate extension and the OIP v2 routes (server/openapi.py)."""
from __future__ import annotations

from typing import Any

from mindie_service.params.keep_alive import OPENAPI_SCHEMA as KEEP_ALIVE

_PARAMS = {"type": "object", "description": "MindIE's sampling parameters (POST /'s table)", "properties": {
    "priority": {"type": "integer", "minimum": 0, "maximum": 5,
                 "description": "Triton's: 0 the default level; 1 most urgent .. 5 (MindIE's levels)"}}}
_OIP_PARAMS = {**_PARAMS, "properties": {**_PARAMS["properties"], "binary_data_output": {
    "type": "boolean", "description": "answer every output not asked otherwise as binary data (Triton's extension)"}}}
_OUTPUT = {"type": "object", "required": ["name"], "additionalProperties": False, "properties": {
    "name": {"enum": ["text_output", "output_ids"]},
    "parameters": {"type": "object", "additionalProperties": False,
                   "properties": {"binary_data": {"type": "boolean"}}}}}
_TENSOR = {"type": "object", "required": ["name", "shape", "datatype", "data"], "additionalProperties": False,
           "properties": {
    "name": {"enum": ["text_input", "input_ids"]}, "shape": {"type": "array", "items": {"type": "integer"}},
    "datatype": {"enum": ["BYTES", "INT32", "INT64"]}, "data": {"type": "array"}, "parameters": {"type": "object"}}}

OPENAPI_SCHEMAS: dict[str, Any] = {
    "V2Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}},
                "description": "Triton and Open Inference Protocol routes: {error}."},
    "InferRequest": {"type": "object", "required": ["inputs"], "additionalProperties": False, "properties": {
        "inputs": {"oneOf": [{"type": "string"}, {"type": "array"}]}, "stream": {"type": "boolean"},
        "keep_alive": KEEP_ALIVE, "parameters": {"type": "object", "properties": {
            "priority": {"type": "integer", "minimum": 1, "maximum": 5, "description": "1 most urgent, 5 the default"},
            "timeout": {"type": "integer", "exclusiveMinimum": 0, "maximum": 3600}}}},
        "description": "MindIE POST /infer: POST /'s body; the answer is one object."},
    "TritonGenerateRequest": {"type": "object", "required": ["text_input"], "additionalProperties": False,
                              "properties": {
        "id": {"type": "string"}, "text_input": {"type": "string"}, "parameters": _PARAMS,
        "keep_alive": KEEP_ALIVE}},
    "TritonGenerateResponse": {"type": "object", "required": ["model_name", "model_version", "text_output"],
                               "properties": {"id": {"type": "string"}, "model_name": {"type": "string"},
                                              "model_version": {"type": "string"},
                                              "text_output": {"type": "string"}, "details": {"type": "object"}}},
    "OipInferRequest": {"type": "object", "required": ["inputs"], "additionalProperties": False, "properties": {
        "id": {"type": "string"}, "inputs": {"type": "array", "items": _TENSOR},
        "outputs": {"type": "array", "items": _OUTPUT}, "parameters": _OIP_PARAMS,
        "keep_alive": KEEP_ALIVE},
        "description": "A binary answer (application/octet-stream, Inference-Header-Content-Length: its JSON "
                       "header's length) when an output is asked for as binary data."},
    "OipInferResponse": {"type": "object", "required": ["model_name", "outputs"], "properties": {
        "id": {"type": "string"}, "model_name": {"type": "string"}, "model_version": {"type": "string"},
        "outputs": {"type": "array"}}},
    "OipModelMetadata": {"type": "object", "required": ["name", "platform", "inputs", "outputs"]},
    "OipServerMetadata": {"type": "object", "required": ["name", "version", "extensions"]},
}

_GEN = {"post": ("TritonGenerateRequest", "TritonGenerateResponse")}
OPENAPI_SHAPES: dict[str, dict[str, tuple[str | None, str | None]]] = {
    "/infer": {"post": ("InferRequest", None)},
    "/v2": {"get": (None, "OipServerMetadata")},
}
for _base in ("/v2/models/{id}", "/v2/models/{id}/versions/{version}"):
    OPENAPI_SHAPES.update({
        f"{_base}/generate": _GEN, f"{_base}/generate_stream": _GEN,
        f"{_base}/infer": {"post": ("OipInferRequest", "OipInferResponse")},
        _base: {"get": (None, "OipModelMetadata")}})

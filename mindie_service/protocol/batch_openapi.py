"""OpenAPI schemas of OpenAI's Files and Batches routes (server/handlers_files.py, handlers_batches.py), for
/openapi.json."""
from __future__ import annotations

from typing import Any

_STR = {"type": "string"}
_INT = {"type": "integer"}
_NULL_INT = {"type": ["integer", "null"]}
_NULL_STR = {"type": ["string", "null"]}
BATCH_STATUSES = ("validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling",
                  "cancelled")


def _page(item: str) -> dict[str, Any]:
    return {"type": "object", "required": ["object", "data", "has_more"], "properties": {
        "object": {"const": "list"}, "data": {"type": "array", "items": {"$ref": f"#/components/schemas/{item}"}},
        "first_id": _NULL_STR, "last_id": _NULL_STR, "has_more": {"type": "boolean"}}}


OPENAPI_SCHEMAS: dict[str, Any] = {
    "FileUpload": {"type": "object", "required": ["file", "purpose"], "properties": {
        "file": {"type": "string", "format": "binary"}, "purpose": {"enum": ["batch"]}},
        "description": "multipart/form-data, streamed to disk; at most ServerConfig.filesStore.maxFileBytes (413)."},
    "FileObject": {"type": "object", "required": ["id", "object", "bytes", "created_at", "filename", "purpose"],
                   "properties": {"id": _STR, "object": {"const": "file"}, "bytes": _INT, "created_at": _INT,
                                  "filename": _STR, "purpose": {"enum": ["batch", "batch_output"]},
                                  "status": _STR, "expires_at": _NULL_INT, "status_details": _NULL_STR}},
    "FileList": _page("FileObject"),
    "FileDeleted": {"type": "object", "required": ["id", "object", "deleted"], "properties": {
        "id": _STR, "object": {"const": "file"}, "deleted": {"type": "boolean"}}},
    "BatchCreateRequest": {"type": "object", "required": ["input_file_id", "endpoint", "completion_window"],
                           "additionalProperties": False, "properties": {
        "input_file_id": _STR, "endpoint": {"type": "string", "description": "/v1/chat/completions, "
                                            "/v1/completions, /v1/responses, or another route the server runs "
                                            "in batches (a 400 lists them)"},
        "completion_window": {"type": "string", "description": "24h, or a value of ServerConfig."
                                                               "batchCompletionWindows"},
        "metadata": {"type": ["object", "null"], "additionalProperties": _STR, "maxProperties": 16}}},
    "Batch": {"type": "object", "required": ["id", "object", "endpoint", "input_file_id", "completion_window",
                                             "status", "created_at", "request_counts"], "properties": {
        "id": _STR, "object": {"const": "batch"}, "endpoint": _STR, "errors": {"type": ["object", "null"]},
        "input_file_id": _STR, "completion_window": _STR, "status": {"enum": list(BATCH_STATUSES)},
        "output_file_id": _NULL_STR, "error_file_id": _NULL_STR, "created_at": _INT, "expires_at": _NULL_INT,
        **{f"{s}_at": _NULL_INT for s in ("in_progress", "finalizing", "completed", "failed", "expired",
                                          "cancelling", "cancelled")},
        "request_counts": {"type": "object", "required": ["total", "completed", "failed"], "properties": {
            "total": _INT, "completed": _INT, "failed": _INT}},
        "metadata": {"type": ["object", "null"]}}},
    "BatchList": _page("Batch"),
}
OPENAPI_SHAPES: dict[str, dict[str, tuple[str | None, str | None]]] = {
    "/v1/files": {"post": ("FileUpload", "FileObject"), "get": (None, "FileList")},
    "/v1/files/{id}": {"get": (None, "FileObject"), "delete": (None, "FileDeleted")},
    "/v1/batches": {"post": ("BatchCreateRequest", "Batch"), "get": (None, "BatchList")},
    "/v1/batches/{id}": {"get": (None, "Batch")},
    "/v1/batches/{id}/cancel": {"post": (None, "Batch")},
}
MULTIPART = ("FileUpload",)  # request bodies sent as multipart/form-data

"""Local references in a JSON Schema that is embedded inside another one (a tool's parameters under the
tool-call wrapper's ``arguments``): every ``$ref`` resolves against the document's root, so a schema moved
under another root must take its root along. ``reroot`` places it under ``#/$defs/<name>`` of the new root and
rewrites each local reference to point there (``#/$defs/X`` -> ``#/$defs/<name>/$defs/X``, ``#`` ->
``#/$defs/<name>``: recursive schemas keep working). ``check_refs`` refuses, naming the field and the schema
path, a reference that is not local or that points at nothing, before any grammar is built.

pydantic's ``model_json_schema()`` writes ``$defs`` for every nested model, so instructor, pydantic-ai and the
OpenAI Agents SDK all send such schemas as tool parameters."""
from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from mindie_service.errors import ValidationError

_DATA = frozenset({"const", "enum", "default", "examples"})  # values, not schemas: never rewritten
_NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def _walk(node: Any, fn: Any, path: str) -> Any:
    """``node`` with ``fn(ref, path)`` applied to each ``$ref`` string of a schema (data keywords skipped)."""
    if isinstance(node, list):
        return [_walk(v, fn, f"{path}/{i}") for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for k, v in node.items():
        at = f"{path}/{k}"
        if k == "$ref" and isinstance(v, str):
            out[k] = fn(v, at)
        elif k in _DATA:
            out[k] = v
        elif k in _NAMED and isinstance(v, dict):
            out[k] = {name: _walk(s, fn, f"{at}/{name}") for name, s in v.items()}
        else:
            out[k] = _walk(v, fn, at)
    return out


def _pointer(root: Any, ref: str) -> bool:
    """Whether the local reference ``ref`` ("#" or "#/a/b", RFC 6901 escapes) names a node of ``root``."""
    node = root
    for raw in ref[1:].split("/")[1:] if ref != "#" else []:
        key = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return False
    return True


def check_refs(schema: Any, where: str) -> None:
    """Refuse (ValidationError naming ``where`` and the schema path) a ``$ref`` that is not a local JSON pointer
    (``#`` or ``#/...``) or that points at nothing in ``schema``."""
    def check(ref: str, at: str) -> str:
        if ref != "#" and not ref.startswith("#/"):
            raise ValidationError(f"Parameter {where} must use only local references (\"#/$defs/...\"), got "
                                  f"$ref {ref!r} at {at or '/'}")
        if not _pointer(schema, ref):
            raise ValidationError(f"Parameter {where} holds a $ref that points at nothing: {ref!r} at {at or '/'}")
        return ref
    _walk(schema, check, "")


def reroot(schema: Any, name: str) -> Any:
    """``schema`` as it must read once placed at ``#/$defs/<name>`` of another document (its local references
    rewritten to point inside it)."""
    base = f"#/$defs/{name}"
    return _walk(schema, lambda ref, at: base + ref[1:] if ref.startswith("#") else ref, "")


def has_refs(schema: Any) -> bool:
    found: list[str] = []
    _walk(schema, lambda ref, at: found.append(ref) or ref, "")
    return bool(found)

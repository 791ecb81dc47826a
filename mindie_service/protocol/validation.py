"""Request bodies: JSON decoding (content type, depth, surrogates) and the shapes that are not numbers
(strings, string lists, objects). Numbers and booleans are read through the rule table (mindie_service.params),
which words every message: ``Parameter max_new_tokens must be in (0, 2147483647], got 0``.
"""
from __future__ import annotations

import json
import re
from typing import Any, Mapping

from mindie_service.errors import BadRequestError, ValidationError, check

_MISSING = object()
MAX_JSON_DEPTH = 64  # requests nest 3-4 levels; json's recursive decoder must never see ~1,000


def _present(obj: Mapping[str, Any], name: str) -> Any:
    """The value of ``name``; absent and JSON null both read as missing."""
    v = obj.get(name, _MISSING)
    return _MISSING if v is None else v


def get_str(obj: Mapping[str, Any], name: str, default: str | None) -> str | None:
    v = _present(obj, name)
    if v is _MISSING:
        return default
    check(isinstance(v, str), name, "a string", v)
    return v


def get_str_list(obj: Mapping[str, Any], name: str, max_items: int, max_len: int) -> list[str]:
    """A string or a list of strings (absent/null: empty), each non-empty and at most ``max_len`` long."""
    v = _present(obj, name)
    if v is _MISSING:
        return []
    items = [v] if isinstance(v, str) else v
    check(isinstance(items, list), name, "a string or a list of strings", v)
    check(len(items) <= max_items, name, f"a list of at most {max_items} strings", f"{len(items)} strings")
    for s in items:
        check(isinstance(s, str) and 0 < len(s) <= max_len, name,
              f"a list of non-empty strings of at most {max_len} characters", s)
    return list(items)


def require_object(v: Any, name: str) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValidationError(f"Parameter {name} must be a JSON object, got {type(v).__name__}")
    return v


def refuse_unknown(obj: Mapping[str, Any], known: frozenset[str] | set[str], prefix: str = "") -> None:
    """ValidationError naming the first key of ``obj`` not in ``known`` (a field accepted and ignored would
    silently change nothing the client asked for); ``prefix`` places it (``parameters.``, ``inputs[0].``)."""
    unknown = sorted(str(k) for k in obj if k not in known)
    if unknown:
        where = f"takes {', '.join(sorted(known))}" if known else "takes no keys"
        raise ValidationError(f"Parameter {prefix}{unknown[0]} is not supported: {prefix.rstrip('.') or 'the body'} "
                              f"{where}")


def reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_body(body: bytes, content_type: str | None) -> dict[str, Any]:
    """Decode a request body: 400 for a wrong content type or malformed JSON, 422 for a non-object."""
    mime = (content_type or "").split(";", 1)[0].strip().lower()
    if mime != "application/json" and not mime.endswith("+json"):
        raise BadRequestError(f"Content-Type must be application/json, got {content_type or 'none'!r}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequestError(f"request body is not valid UTF-8: {e}") from None
    depth = nesting_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise BadRequestError(f"request body nests arrays and objects {depth} deep, at most {MAX_JSON_DEPTH}")
    try:
        obj = json.loads(text, parse_constant=reject_constant)
    except RecursionError:
        raise BadRequestError(f"request body nests too deeply (at most {MAX_JSON_DEPTH})") from None
    except ValueError as e:
        raise BadRequestError(f"request body is not valid JSON: {e}") from None
    bad = _lone_surrogate(obj)
    if bad is not None:
        raise BadRequestError(f"request body holds a lone UTF-16 surrogate (\\u{ord(bad):04x}), which is not a "
                              f"character")
    if not isinstance(obj, dict):
        raise ValidationError(f"request body must be a JSON object, got {type(obj).__name__}")
    return obj



_BRACKETS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def nesting_depth(text: str) -> int:
    """Deepest nesting of arrays/objects in JSON ``text``, strings skipped (a regex scan: linear, no
    recursion). Malformed text gives some number; json.loads reports it properly afterwards."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return 0  # cannot nest deeper than the brackets it holds
    depth = deepest = 0
    for m in _BRACKETS.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def _lone_surrogate(obj: Any) -> str | None:
    """The first lone surrogate in any string (key or value) of a decoded JSON document, else None.
    Iterative: the depth is already bounded, but a wide document must not cost recursion either."""
    stack = [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if not v.isascii():
                m = _SURROGATE.search(v)
                if m:
                    return m.group()
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")

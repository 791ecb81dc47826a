"""Shared validation rules: one place for types, ranges and the wording of their messages.

Every message names the parameter, the rule and the value given, e.g.
``Parameter max_new_tokens must be in (0, 2147483647], got 0``.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

from mindie_service.errors import BadRequestError, ValidationError, check

_MISSING = object()


def _fmt(x: float) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return f"{x:.1f}"
    return f"{x:g}" if isinstance(x, float) else str(x)


@dataclass(frozen=True)
class Range:
    """A numeric interval; ``str()`` gives the rule as messages print it: ``in (0, 1.0]`` or ``> 0.0``."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = True
    hi_open: bool = False

    def __contains__(self, v: float) -> bool:
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        if self.hi is not None and (v >= self.hi if self.hi_open else v > self.hi):
            return False
        return True

    def __str__(self) -> str:
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {_fmt(self.lo)}" if self.lo is not None else "a number"
        if self.lo is None:
            return f"{'<' if self.hi_open else '<='} {_fmt(self.hi)}"
        return f"in {'(' if self.lo_open else '['}{_fmt(self.lo)}, {_fmt(self.hi)}{')' if self.hi_open else ']'}"


def _present(obj: Mapping[str, Any], name: str) -> Any:
    """The value of ``name``; absent and JSON null both read as missing."""
    v = obj.get(name, _MISSING)
    return _MISSING if v is None else v


def get_bool(obj: Mapping[str, Any], name: str, default: bool | None) -> bool | None:
    v = _present(obj, name)
    if v is _MISSING:
        return default
    check(isinstance(v, bool), name, "a boolean", v)
    return v


def get_int(obj: Mapping[str, Any], name: str, rng: Range, default: int | None) -> int | None:
    v = _present(obj, name)
    if v is _MISSING:
        return default
    check(isinstance(v, int) and not isinstance(v, bool), name, "an integer", v)
    check(v in rng, name, str(rng), v)
    return v


def get_float(obj: Mapping[str, Any], name: str, rng: Range, default: float | None) -> float | None:
    v = _present(obj, name)
    if v is _MISSING:
        return default
    check(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v), name, "a number", v)
    check(v in rng, name, str(rng), v)
    return float(v)


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


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_body(body: bytes, content_type: str | None) -> dict[str, Any]:
    """Decode a request body: 400 for a wrong content type or malformed JSON, 422 for a non-object."""
    mime = (content_type or "").split(";", 1)[0].strip().lower()
    if mime != "application/json" and not mime.endswith("+json"):
        raise BadRequestError(f"Content-Type must be application/json, got {content_type or 'none'!r}")
    try:
        obj = json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as e:
        raise BadRequestError(f"request body is not valid UTF-8: {e}") from None
    except ValueError as e:
        raise BadRequestError(f"request body is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ValidationError(f"request body must be a JSON object, got {type(obj).__name__}")
    return obj


"""Wording of config problems: key paths, values, and JSON Schema errors turned into one line each
(``ServerConfig.port must be an integer in [1024, 65535], got 80``)."""
from __future__ import annotations

import difflib
import json
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema

from mindie_service.config.schema import validator

S = "ServerConfig"
D = "BackendConfig.ModelDeployConfig"
SC = "BackendConfig.ScheduleConfig"

_TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "a boolean",
               "array": "a list", "object": "an object", "null": "null"}
_FORMAT_WORDS = {"ipv4": "an IPv4 address", "ipv6": "an IPv6 address"}


def key_path(parts: Any) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def show(value: Any) -> str:
    """A value as it would appear in config.json, cut to 80 characters."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def label(path: str, sources: Mapping[str, str]) -> str:
    """The key path, naming the environment variable that set it, if one did."""
    src = sources.get(path)
    return path if src is None else f"{path} (set by {src if src.startswith('--') or ' ' in src else 'env ' + src})"


def _join(path: str, key: str) -> str:
    return key if path == "(top level)" else f"{path}.{key}"


def _range(s: Mapping[str, Any]) -> str:
    lo_incl, hi_incl = "minimum" in s, "maximum" in s
    lo = s.get("minimum", s.get("exclusiveMinimum"))
    hi = s.get("maximum", s.get("exclusiveMaximum"))
    if lo is not None and hi is not None:
        return f"in {'[' if lo_incl else '('}{lo}, {hi}{']' if hi_incl else ')'}"
    if lo is not None:
        return f"{'>=' if lo_incl else '>'} {lo}"
    if hi is not None:
        return f"{'<=' if hi_incl else '<'} {hi}"
    return ""


def _describe(s: Mapping[str, Any]) -> str:
    """A schema as the phrase after 'must be'."""
    if "const" in s:
        return show(s["const"])
    if "enum" in s:
        return show(s["enum"][0]) if len(s["enum"]) == 1 else "one of " + ", ".join(show(v) for v in s["enum"])
    if "format" in s:
        return _FORMAT_WORDS.get(s["format"], f"a {s['format']}")
    types = [s["type"]] if isinstance(s.get("type"), str) else list(s.get("type", []))
    words = [_TYPE_WORDS[t] for t in types if t != "null"] + (["null"] if "null" in types else [])
    text = " or ".join(words)
    if "items" in s and types == ["array"]:
        text = f"a list, each item {_describe(s['items'])}"
    if "string" in types and s.get("minLength") == 1 and "pattern" not in s:
        text = text.replace("a string", "a non-empty string")
    details = [d for d in (_range(s),) if d]
    if "pattern" in s:
        details.append(f"matching {s['pattern']}")
    if "maxLength" in s:
        details.append(f"of at most {s['maxLength']} characters")
    if "anyOf" in s:
        alts = " or ".join(_describe(b) or "valid" for b in s["anyOf"])
        if all("format" in b for b in s["anyOf"]):
            return alts
        details.append(f"({alts})")
    return " ".join([text or "a value", *details]).strip()


def _explain(err: jsonschema.ValidationError, sources: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    """(key path, message) for one schema error."""
    path = key_path(err.absolute_path)
    v = err.validator
    if v == "additionalProperties":
        known = list(err.schema.get("properties", {}))
        for key in sorted(k for k in err.instance if k not in known):
            hint = difflib.get_close_matches(key, known, n=1)
            yield _join(path, key), (f"{_join(path, key)} is not a known key"
                                     + (f" (did you mean {hint[0]!r}?)" if hint else ""))
    elif v == "required":
        for key in err.validator_value:
            if key not in err.instance:
                yield _join(path, key), f"{_join(path, key)} is required"
    elif v == "minItems":
        yield path, f"{label(path, sources)} must have at least {err.validator_value} item(s), got {show(err.instance)}"
    elif v == "maxItems":
        yield path, f"{label(path, sources)} must have at most {err.validator_value} items, got {len(err.instance)}"
    elif v == "uniqueItems":
        yield path, f"{label(path, sources)} must not repeat an item, got {show(err.instance)}"
    else:
        # an API key is never repeated back (config errors are logged)
        got = "(a key, not shown)" if "ApiKeys" in path else show(err.instance)
        yield path, f"{label(path, sources)} must be {_describe(err.schema)}, got {got}"


def schema_problems(data: Any, sources: Mapping[str, str]) -> tuple[list[str], set[str]]:
    """One message per schema violation, and the key paths that failed (cross-key rules skip them)."""
    problems: list[str] = []
    bad: set[str] = set()
    errors = sorted(validator().iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])
    for err in errors:
        for path, message in _explain(err, sources):
            bad.add(path)
            if message not in problems:
                problems.append(message)
    return problems, bad

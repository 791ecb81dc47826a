"""What a request asks its output to match: plain, hashable data (no grammar library), carried by the sampling
parameters from every front door (OpenAI ``response_format``, vLLM ``structured_outputs``, TGI / MindIE
``parameters.grammar``, batch-job options, the offline ``SamplingParams(structured_outputs=...)``)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from mindie_service.errors import ValidationError, check

Kind = Literal["json", "regex", "choice", "grammar"]
KINDS: tuple[str, ...] = ("json", "regex", "choice", "grammar")
MAX_SOURCE_CHARS = 256 * 1024  # a schema, regex or grammar text longer than this is refused before compiling
MAX_CHOICES = 4096
ANY_JSON_OBJECT = '{"type":"object"}'  # OpenAI's json_object: any valid JSON object


@dataclass(frozen=True)
class StructuredSpec:
    """``kind`` json (``source``: a JSON Schema as compact JSON text), regex (a regular expression), choice
    (``source``: a JSON list of the allowed strings) or grammar (a Lark grammar in llguidance's dialect).
    ``where``: the request field it came from, named by a refusal (``response_format.json_schema.schema``).
    ``whitespace_flexible``: JSON may hold free whitespace between tokens (off: compact JSON, the default).
    ``keep_special``: special tokens the grammar names whose text the output keeps (a tool call's marker token,
    which the detokenizer would otherwise drop, so that the call parser sees it).
    ``parts``: (field, JSON Schema text) of each schema a grammar embeds (each tool's parameters): a grammar that
    is refused is explained by the first part refused alone, named by its field, never by the grammar's text."""

    kind: Kind
    source: str
    where: str = "structured_outputs"
    whitespace_flexible: bool = False
    keep_special: tuple[int, ...] = ()
    parts: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        check(self.kind in KINDS, self.where, f"one of {', '.join(KINDS)}", self.kind)
        check(isinstance(self.source, str) and 0 < len(self.source) <= MAX_SOURCE_CHARS, self.where,
              f"a non-empty grammar of at most {MAX_SOURCE_CHARS} characters",
              len(self.source) if isinstance(self.source, str) else self.source)

    @property
    def key(self) -> tuple[str, str, bool]:
        """The grammar's identity (the compile cache's key with the tokenizer's)."""
        return self.kind, self.source, self.whitespace_flexible


def closed_objects(schema: Any) -> Any:
    """``schema`` with every object that lists ``properties`` and says nothing of others closed to them
    (``additionalProperties: false``): OpenAI's strict mode, and a tool call's arguments (the function's
    parameters, no more). A schema that says otherwise keeps its word."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k in ("const", "enum", "default", "examples") else closed_objects(v)) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def json_spec(schema: Any, where: str, *, whitespace_flexible: bool = False) -> StructuredSpec:
    """A JSON Schema (an object, or true: any JSON value) as a spec; its text compact, key order kept (the output follows the schema's property order)."""
    if schema is True:
        schema = {}
    check(isinstance(schema, dict), where, "a JSON Schema object", schema)
    try:
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValidationError(f"Parameter {where} must be a JSON Schema object: {e}") from None
    return StructuredSpec("json", text, where, whitespace_flexible)


def schema_value(v: Any, where: str) -> StructuredSpec:
    """A JSON Schema given as an object or as its JSON text (vLLM's ``guided_json`` / ``json`` take both)."""
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError as e:
            raise ValidationError(f"Parameter {where} must be a JSON Schema (an object or its JSON text): {e}") from None
    return json_spec(v, where)

def choice_spec(choices: Any, where: str) -> StructuredSpec:
    check(isinstance(choices, list) and 0 < len(choices) <= MAX_CHOICES
          and all(isinstance(c, str) and c for c in choices), where,
          f"a list of 1 to {MAX_CHOICES} non-empty strings", choices)
    return StructuredSpec("choice", json.dumps(choices, ensure_ascii=False), where)


def text_spec(kind: Kind, value: Any, where: str) -> StructuredSpec:
    """A regex or a Lark grammar given as text."""
    check(isinstance(value, str) and value != "", where, f"a non-empty string ({kind})", value)
    return StructuredSpec(kind, value, where)


def from_vllm(obj: Any, where: str = "structured_outputs") -> StructuredSpec | None:
    """vLLM's ``structured_outputs`` object (also the offline ``SamplingParams(structured_outputs=...)``):
    exactly one of ``json`` (a schema object or its JSON text), ``regex``, ``choice``, ``grammar`` (Lark), or
    ``json_object: true``. A StructuredSpec passes through; None and ``{}`` mean unconstrained."""
    if obj is None or isinstance(obj, StructuredSpec):
        return obj
    if not isinstance(obj, dict):
        obj = {k: getattr(obj, k) for k in ("json", "regex", "choice", "grammar", "json_object")
               if getattr(obj, k, None) is not None}  # vLLM's StructuredOutputsParams dataclass
    known = {"json", "regex", "choice", "grammar", "json_object", "whitespace_pattern", "disable_any_whitespace",
             "disable_fallback", "disable_additional_properties", "structural_tag", "backend"}
    unknown = sorted(set(obj) - known)
    check(not unknown, where, f"an object of {', '.join(sorted(known))}", unknown)
    given = [k for k in ("json", "regex", "choice", "grammar", "json_object") if obj.get(k) not in (None, False)]
    if not given:
        return None
    check(len(given) == 1, where, "exactly one of json, regex, choice, grammar, json_object", given)
    k, v, at = given[0], obj[given[0]], f"{where}.{given[0]}"
    if k == "json_object":
        return StructuredSpec("json", ANY_JSON_OBJECT, at)
    if k == "json":
        return schema_value(v, at)
    if k == "choice":
        return choice_spec(v, at)
    return text_spec(k, v, at)  # type: ignore[arg-type]

"""Each API's spelling of structured output -> a ``StructuredSpec`` (or None: unconstrained). Shapes only:
whether a schema or regex is valid is the compiler's to say (it compiles off the IO loop and names the field).

- OpenAI ``response_format``: ``{"type": "text"}``, ``{"type": "json_object"}``, ``{"type": "json_schema",
  "json_schema": {"name", "schema", "strict"?, "description"?}}``; TGI's chat forms ``{"type": "json", "value":
  <schema>}`` and ``{"type": "json_object", "value": <schema>}`` (huggingface_hub's clients send them) and
  ``{"type": "regex", "value": "..."}``. With ``strict``
  true, objects that list their properties admit no others (OpenAI's strict mode).
- TGI ``/generate*`` and MindIE ``/``: ``parameters.grammar`` ``{"type": "json" | "regex", "value": ...}``
  (TGI 1.4's shape; a JSON value may be a schema object or its JSON text).
- vLLM ``structured_outputs`` (``openAiSupport: "vllm"``; ``spec.from_vllm``), and vLLM's older
  ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar`` fields."""
from __future__ import annotations

import re
from typing import Any

from mindie_service.errors import ValidationError, check
from mindie_service.structured.grammar_spec import (ANY_JSON_OBJECT, StructuredSpec, choice_spec, closed_objects, from_vllm,
                                           json_spec, schema_value, text_spec)

NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for json_schema.name (and function names)
GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def response_format(v: Any, where: str = "response_format") -> StructuredSpec | None:
    """OpenAI's ``response_format`` (and TGI's chat form of it)."""
    if v is None:
        return None
    check(isinstance(v, dict), where, 'an object {"type": "text" | "json_object" | "json_schema" | "json"}', v)
    kind = v.get("type")
    if kind == "text":
        check(set(v) <= {"type"}, where, '{"type": "text"} only', sorted(v))
        return None
    if kind == "json_object":
        check(set(v) <= {"type", "value"}, where, '{"type": "json_object"} (or TGI\'s {"type", "value": schema})',
              sorted(v))
        if v.get("value") is not None:  # huggingface_hub's chat_completion sends a json_schema this way (TGI's)
            return schema_value(v["value"], f"{where}.value")
        return StructuredSpec("json", ANY_JSON_OBJECT, where)
    if kind == "json_schema":
        js = v.get("json_schema")
        at = f"{where}.json_schema"
        check(isinstance(js, dict), at, 'an object {"name", "schema", "strict"?, "description"?}', js)
        extra = sorted(set(js) - {"name", "schema", "strict", "description"})
        check(not extra, at, "an object of name, schema, strict, description", extra)
        check(isinstance(js.get("name"), str) and NAME_RE.match(js["name"]) is not None, f"{at}.name",
              "a string of 1 to 64 letters, digits, _ or -", js.get("name"))
        check(js.get("strict") is None or isinstance(js.get("strict"), bool), f"{at}.strict", "a boolean",
              js.get("strict"))
        check(js.get("description") is None or isinstance(js.get("description"), str), f"{at}.description",
              "a string", js.get("description"))
        schema = js.get("schema", {})
        return json_spec(closed_objects(schema) if js.get("strict") else schema, f"{at}.schema")
    if kind in ("json", "regex"):  # TGI's chat route
        check(set(v) <= {"type", "value"}, where, '{"type", "value"}', sorted(v))
        check("value" in v, f"{where}.value", "present", None)
        return schema_value(v["value"], f"{where}.value") if kind == "json" else \
            text_spec("regex", v["value"], f"{where}.value")
    raise ValidationError(f"Parameter {where}.type must be one of text, json_object, json_schema (or TGI's json, "
                          f"regex), got {kind!r}")


def tgi_grammar(v: Any, where: str = "grammar") -> StructuredSpec | None:
    """TGI / MindIE ``parameters.grammar``: ``{"type": "json" | "regex", "value": ...}``; null: none."""
    if v is None:
        return None
    check(isinstance(v, dict) and set(v) <= {"type", "value"} and "value" in v, where,
          'an object {"type": "json" | "regex", "value": ...}', v)
    kind = v.get("type")
    check(kind in ("json", "regex"), f"{where}.type", "json or regex", kind)
    return schema_value(v["value"], f"{where}.value") if kind == "json" else \
        text_spec("regex", v["value"], f"{where}.value")


def vllm_fields(body: dict[str, Any]) -> StructuredSpec | None:
    """vLLM's ``structured_outputs`` object, or one of its older ``guided_*`` fields."""
    spec = from_vllm(body.get("structured_outputs"))
    for name, kind in GUIDED.items():
        v = body.get(name)
        if v is None:
            continue
        check(spec is None, name, "absent when another structured-output field is given", v)
        spec = (schema_value(v, name) if kind == "json" else choice_spec(v, name) if kind == "choice"
                else text_spec(kind, v, name))  # type: ignore[arg-type]
    return spec


def one_of(*specs: tuple[str, StructuredSpec | None]) -> StructuredSpec | None:
    """The one spec given; two fields that both constrain the output are refused by name."""
    given = [(n, s) for n, s in specs if s is not None]
    if len(given) > 1:
        raise ValidationError(f"Parameter {given[1][0]} must be absent when {given[0][0]} constrains the output")
    return given[0][1] if given else None

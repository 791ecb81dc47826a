"""The JSON Schema of config.json, shipped inside the package (config.schema.json beside this
module) so an installed wheel finds it: the shape, the rules and every default."""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

import jsonschema

SCHEMA_RESOURCE = "config.schema.json"


@lru_cache(maxsize=1)
def load_schema() -> dict[str, Any]:
    text = resources.files(__package__).joinpath(SCHEMA_RESOURCE).read_text(encoding="utf-8")
    return json.loads(text)


@lru_cache(maxsize=1)
def validator() -> jsonschema.Draft202012Validator:
    cls = jsonschema.Draft202012Validator
    return cls(load_schema(), format_checker=cls.FORMAT_CHECKER)

"""One parameter's rule: its kind and range, and the check every dialect runs (types, range, float32)."""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from mindie_service.errors import ValidationError, check
from mindie_service.params.ranges import F32_MAX, F32_TINY, Range

Kind = Literal["int", "float", "bool", "early_stopping"]
_KIND_PHRASE = {"int": "an integer", "float": "a number", "bool": "a boolean",
                "early_stopping": 'true, false or "never"'}


@dataclass(frozen=True)
class Rule:
    """``kind`` and ``range`` decide; ``text`` replaces the printed rule where a dialect documents its own words."""

    kind: Kind
    range: Range | None = None
    text: str | None = None
    integral_float: bool = False  # an int field takes 2.0 (HF's JSON does)

    @property
    def type_phrase(self) -> str:
        """What a value of the wrong type is told it must be."""
        return self.text or _KIND_PHRASE[self.kind]

    def accepts(self, value: Any) -> bool:
        try:
            self.checked(value, "")
        except ValidationError:
            return False
        return True

    def checked(self, value: Any, shown: str) -> Any:
        """``value`` (JSON types) by this rule, or a ValidationError naming ``shown`` (the dialect's spelling)."""
        if self.kind == "bool" or (self.kind == "early_stopping" and value != "never"):
            check(isinstance(value, bool), shown, self.type_phrase, value)
            return value
        if self.kind == "early_stopping":
            return value
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if self.kind == "int":
            if self.integral_float and number and isinstance(value, float) and value.is_integer():
                value = int(value)
            check(number and isinstance(value, int), shown, self.type_phrase, value)
        else:
            check(number and math.isfinite(value), shown, self.type_phrase, value)
        if self.range is not None:
            check(value in self.range, shown, self.text or str(self.range), value)
        if self.kind == "float":
            # The engine samples in 32-bit floats at best: a value that rounds to 0 or infinity there would
            # divide by zero (1e-300 -> 0.0) or overflow (1e39 -> inf).
            check(value == 0 or F32_TINY <= abs(value) <= F32_MAX, shown, f"representable as a 32-bit float "
                  f"(0 or {F32_TINY:g} <= |value| <= {F32_MAX:g})", value)
            return float(value)
        return value


@dataclass(frozen=True)
class Field:
    """A dialect's field: the neutral parameter it sets and the rule it is read by."""

    neutral: str
    rule: Rule


FieldTable = Mapping[str, Field]  # the field as the dialect spells it -> Field


def read_fields(obj: Mapping[str, Any], table: FieldTable, prefix: str = "") -> dict[str, Any]:
    """Every field of ``table`` that ``obj`` holds (absent and JSON null read as missing), checked, keyed by
    its neutral name (a later field of the table overrides an earlier one naming the same parameter)."""
    out: dict[str, Any] = {}
    for name, f in table.items():
        v = obj.get(name)
        if v is not None:
            out[f.neutral] = f.rule.checked(v, prefix + name)
    return out

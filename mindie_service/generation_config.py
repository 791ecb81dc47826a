"""Hugging Face ``generate``'s generation config, as the seed REST API (/api/*) takes it.

One table of fields (``params.table.HF``: type and range; HF's defaults are GenerationConfig's) serves
three readers: the request's
``generation_config`` object (422 naming ``generation_config.<field>``), the config file's
``GenerationDefaults`` section and the ``MINDIE_GEN_<FIELD>`` environment variables (both read
at start-up, a bad value stops it). Precedence, highest first: the request, the environment
(real variables over the ``.env`` file beside the config), ``GenerationDefaults``, the model's
``model.json`` ``parameters``, then HF's defaults below."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from mindie_service.errors import ValidationError
from mindie_service.params.table import HF
from mindie_service.sampling_params import SamplingParams

ENV_PREFIX = "MINDIE_GEN_"
FIELDS = HF  # HF generate's fields, their ranges and HF's deviations: mindie_service.params.table.HF


@dataclass(frozen=True)
class GenerationConfig:
    """Resolved generation settings; the defaults are HF ``GenerationConfig``'s (max_new_tokens: its
    max_length of 20, counted as new tokens as MindIE's routes do)."""

    num_beams: int = 1
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 50
    max_new_tokens: int = 20
    repetition_penalty: float = 1.0
    length_penalty: float = 1.0
    early_stopping: bool | str = False

    def merged(self, values: Mapping[str, Any]) -> "GenerationConfig":
        return replace(self, **{k: v for k, v in values.items() if k in FIELDS})

    def checked(self, prefix: str = "generation_config.") -> "GenerationConfig":
        """The combination rules (ranges are checked per field as values are read)."""
        if self.do_sample:
            if self.num_beams > 1:
                raise ValidationError(f"Parameter {prefix}num_beams must be 1 when {prefix}do_sample is true "
                                      f"(beam sampling is not supported), got {self.num_beams}")
            if self.temperature <= 0.0:
                raise ValidationError(f"Parameter {prefix}temperature must be > 0 when {prefix}do_sample is true, "
                                      f"got {self.temperature!r}")
        return self

    def sampling_params(self, **extra: Any) -> SamplingParams:
        """do_sample false: greedy, or beam search with num_beams > 1 (the warpers are HF's no-ops then)."""
        sample = self.do_sample
        return SamplingParams(
            max_tokens=self.max_new_tokens,
            temperature=self.temperature if sample else 0.0,
            top_k=self.top_k if sample else 0,
            top_p=self.top_p if sample else 1.0,
            repetition_penalty=self.repetition_penalty,
            num_beams=self.num_beams, length_penalty=self.length_penalty, early_stopping=self.early_stopping,
            **extra)


def check_field(name: str, value: Any, shown: str) -> Any:
    """``value`` of field ``name`` (JSON types), or ValidationError naming ``shown``."""
    return FIELDS[name].rule.checked(value, shown)


def parse_text_value(name: str, text: str, shown: str) -> Any:
    """A field from text (an environment variable, a .env line, a string in model.json)."""
    t = text.strip()
    low = t.lower()
    rule = FIELDS[name].rule
    if rule.kind in ("bool", "early_stopping"):
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        return check_field(name, "never" if low == "never" else t, shown)
    try:
        value: Any = int(t) if rule.kind == "int" and low.lstrip("+-").isdigit() else float(t)
    except ValueError:
        raise ValidationError(f"Parameter {shown} must be {rule.type_phrase}, got {text!r}") from None
    return check_field(name, value, shown)


def read_object(obj: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """A request's ``generation_config`` object: known fields checked, an unknown field refused (422)."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if key not in FIELDS:
            raise ValidationError(f"Parameter {prefix}{key} is not a generation_config field "
                                  f"(known: {', '.join(FIELDS)})")
        if value is not None:
            out[key] = check_field(key, value, prefix + key)
    return out


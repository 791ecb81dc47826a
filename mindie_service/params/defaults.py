"""A model's request defaults (its model.json ``parameters``), in neutral names."""
from __future__ import annotations

from dataclasses import dataclass

from mindie_service.params.table import OPENAI_COMPLETION, POSITIVE_INT32


@dataclass(frozen=True)
class RequestDefaults:
    """A model's request defaults; None: the dialect's own default."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None  # token_limit

    @classmethod
    def within_rules(cls, *, temperature: float | None, top_p: float | None, top_k: int | None,
                     max_tokens: int | None) -> "RequestDefaults":
        """A model file's values, each kept only where the OpenAI routes' rule takes it (they are the defaults
        of those routes); top_p 1 and top_k 0 (Jan's "off") are no default."""
        def keep(value: float | None, rule_of: str) -> float | None:
            return value if value is not None and OPENAI_COMPLETION[rule_of].rule.accepts(value) else None
        top_p = keep(top_p, "top_p")
        return cls(temperature=keep(temperature, "temperature"), top_p=top_p if top_p != 1.0 else None,
                   top_k=top_k if top_k is not None and POSITIVE_INT32.accepts(top_k) else None,
                   max_tokens=keep(max_tokens, "max_tokens"))  # type: ignore[arg-type]

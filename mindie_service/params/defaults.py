"""A model's request defaults (its model.json ``parameters``), in neutral names."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestDefaults:
    """A model's request defaults; None: the dialect's own default."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None  # token_limit

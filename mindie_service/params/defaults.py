"""A model's request defaults (its model.json ``parameters``, its generation_config.json), in neutral names."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mindie_service.params.rule import Rule
from mindie_service.params.table import OPENAI_COMPLETION, POSITIVE_INT32, REPETITION_PENALTY, VLLM


@dataclass(frozen=True)
class RequestDefaults:
    """A model's request defaults; None: the dialect's own default."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None  # token_limit; generation_config.json's max_new_tokens
    repetition_penalty: float | None = None  # generation_config.json (vLLM's --generation-config)
    min_p: float | None = None
    max_tokens_cap: int | None = None  # vLLM: a --generation-config folder's max_new_tokens caps every request

    @classmethod
    def within_rules(cls, *, temperature: float | None, top_p: float | None, top_k: int | None,
                     max_tokens: int | None, repetition_penalty: float | None = None,
                     min_p: float | None = None) -> "RequestDefaults":
        """A model file's values, each kept only where the OpenAI routes' rule takes it (they are the defaults
        of those routes); top_p 1 and top_k 0 (Jan's "off") are no default."""
        def keep(value: float | None, rule: Rule) -> float | None:
            return value if value is not None and rule.accepts(value) else None
        top_p = keep(top_p, OPENAI_COMPLETION["top_p"].rule)
        return cls(temperature=keep(temperature, OPENAI_COMPLETION["temperature"].rule),
                   top_p=top_p if top_p != 1.0 else None,
                   top_k=top_k if top_k is not None and POSITIVE_INT32.accepts(top_k) else None,
                   max_tokens=keep(max_tokens, OPENAI_COMPLETION["max_tokens"].rule),  # type: ignore[arg-type]
                   repetition_penalty=keep(repetition_penalty, REPETITION_PENALTY),
                   min_p=keep(min_p, VLLM["min_p"].rule))

    def over(self, base: "RequestDefaults") -> "RequestDefaults":
        """These defaults, ``base``'s where these have none (model.json's over generation_config.json's)."""
        return dataclasses.replace(base, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                                            if getattr(self, f.name) is not None})

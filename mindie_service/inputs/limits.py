"""The input-length rule, in one place: ``truncate`` keeps the last N tokens, then a prompt over the limit
is refused (422) or, with ModelDeployConfig.truncation on, cut to its last ``limit`` tokens."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from mindie_service.errors import ContextLengthError


@dataclass(frozen=True)
class InputLimits:
    """What the processor checks prompts against, from the engine's config and its KV pool."""

    max_input_len: int  # min(maxInputTokenLen, maxSeqLen - 1, KV pool tokens - 1)
    truncation: bool  # ModelDeployConfig.truncation: cut long inputs instead of refusing them
    vocab_size: int

    @classmethod
    def of(cls, *, effective_max_input_len: int, pool_tokens: int, truncation: bool,
           vocab_size: int) -> "InputLimits":
        """A prompt must also leave one KV slot for the first generated token."""
        return cls(min(effective_max_input_len, pool_tokens - 1), truncation, vocab_size)


def fit_prompt(ids: Sequence[int], truncate: int | None, limits: InputLimits, *,
               media: bool = False, field: str = "inputs") -> tuple[int, ...]:
    """Apply ``truncate``, then the length limit. A media prompt is never cut: cutting would drop media
    placeholders whose embeddings the request still carries. ``field``: the request's name for the prompt."""
    if truncate is not None and truncate < len(ids):
        ids = ids[-truncate:]
    limit = limits.max_input_len
    if len(ids) > limit:
        if media or not limits.truncation:
            expanded = " with media placeholders expanded" if media else ""
            raise ContextLengthError(f"Parameter {field} must be at most {limit} tokens (maxInputTokenLen, "
                                  f"maxSeqLen - 1 and the KV pool bound it){expanded}, got {len(ids)} tokens")
        ids = ids[-limit:]
    return tuple(ids)

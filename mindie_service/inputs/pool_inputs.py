"""Inputs of prefill-only requests (embeddings, rerank, score) -> token ids, under the input-length rule.

A text is tokenized as the checkpoint's tokenizer does by default (special tokens added, as sentence-transformers
and transformers do); token ids are taken as given, checked against the vocabulary. A (query, document) pair is
one input, joined by the tokenizer's own pair template (``tokenizer(text, text_pair=...)``, as cross-encoders are
trained and as vLLM scores them)."""
from __future__ import annotations

from typing import Any, Sequence

from mindie_service.engine.contract import InputFacts
from mindie_service.errors import ValidationError
from mindie_service.inputs.limits import InputLimits, fit_prompt

PoolInput = str | Sequence[int]


def _limits(facts: InputFacts) -> InputLimits:
    return InputLimits.of(effective_max_input_len=facts.max_input_len, pool_tokens=facts.pool_tokens,
                          truncation=facts.truncation, vocab_size=facts.vocab_size)


def _ids(facts: InputFacts, ids: Sequence[int], field: str) -> tuple[int, ...]:
    if not ids:
        raise ValidationError(f"Parameter {field} must not be empty (no tokens)")
    bad = next((t for t in ids if not 0 <= t < facts.vocab_size), None)
    if bad is not None:
        raise ValidationError(f"Parameter {field} must hold token ids in [0, {facts.vocab_size}), got {bad}")
    return fit_prompt(ids, None, _limits(facts), field=field)


def pool_inputs(facts: InputFacts, items: Sequence[PoolInput], field: str = "input") -> tuple[tuple[int, ...], ...]:
    """Texts (tokenized) or token-id lists -> the engine's inputs, each within the length rule."""
    out = []
    for k, item in enumerate(items):
        name = f"{field}[{k}]" if len(items) > 1 else field
        if isinstance(item, str):
            if not item:
                raise ValidationError(f"Parameter {name} must be a non-empty string")
            out.append(_ids(facts, facts.tokenize(item), name))
        else:
            out.append(_ids(facts, list(item), name))
    return tuple(out)


def pair_inputs(facts: InputFacts, pairs: Sequence[tuple[str, str]],
                field: str = "documents") -> tuple[tuple[int, ...], ...]:
    """(query, document) text pairs -> one input each, through the tokenizer's pair template."""
    tok: Any = facts.tokenizer
    if tok is None:
        raise ValidationError("this model has no tokenizer for text pairs")
    out = []
    for k, (a, b) in enumerate(pairs):
        if not a or not b:
            raise ValidationError(f"Parameter {field}[{k}] and its query must be non-empty strings")
        out.append(_ids(facts, list(tok(a, text_pair=b).input_ids), f"{field}[{k}]"))
    return tuple(out)

"""OpenAI's legacy ``logprobs`` object on /v1/completions, and prompt scoring (``echo`` + ``max_tokens: 0``).

``text_offset`` counts characters of the returned text only: a special token the text does not spell (the
BOS a tokenizer adds to a text prompt) takes no characters, and no offset points past the text. The prompt's
first token has no logprob and no alternatives (null, null), as on OpenAI; every other token's
``top_logprobs`` holds its ``logprobs`` best alternatives, prompt tokens included."""
from __future__ import annotations

from typing import Any

from mindie_service.engine.contract import TokenInfo


def _width(t: TokenInfo, text: str, pos: int) -> int:
    """The characters ``t`` takes in ``text`` at ``pos``: 0 for a special token the text does not spell."""
    if t.special and not text.startswith(t.text, pos):
        return 0
    return len(t.text)


def completion_logprobs(tokens: list[TokenInfo], k: int, text: str, start: int = 0) -> dict[str, Any]:
    """The logprobs object for ``tokens``, which spell ``text``; ``start``: where ``text`` begins in the
    choice's whole text (a stream frame's offset)."""
    offsets, pos = [], 0
    for t in tokens:
        offsets.append(start + min(pos, len(text)))
        pos += _width(t, text, pos)
    return {"tokens": [t.text for t in tokens], "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [({a.text: a.logprob for a in t.top[:k]} if t.logprob is not None else None)
                             for t in tokens], "text_offset": offsets}


def choice_tokens(prompt: list[TokenInfo], generated: list[TokenInfo], *, echo: bool,
                  score_only: bool) -> list[TokenInfo]:
    """The tokens a completion choice reports: the prompt's when echoed, then the generated ones unless the
    request only scores its prompt (the engine's one token is dropped)."""
    return (prompt if echo else []) + ([] if score_only else generated)


def completion_count(generated: list[TokenInfo], score_only: bool) -> int:
    """``usage.completion_tokens`` of one choice."""
    return 0 if score_only else len(generated)

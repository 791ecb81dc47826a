"""Bounded tokenization: a prompt's cost is set by what the length rule can keep, not by what was sent.

Two facts about the tokenizer make it cheap (``TextBound.of``): the most characters one token covers
(``max_token_chars``, the longest vocabulary entry: byte-level pieces are at least as long as the text
they decode to), and the special ids it adds to every text (``tokenize("")``, e.g. BOS).

- No cutting allowed: a text longer than ``limit x max_token_chars`` characters holds more than
  ``limit`` tokens for certain, so it is refused before the tokenizer sees it.
- Cutting (``truncate``, or ModelDeployConfig.truncation): only a tail of the text is tokenized, long
  enough to hold the tokens kept plus a margin. The tail starts at a word boundary (a space after a
  non-space, where byte-level and SentencePiece pre-tokenizers split anyway) and its first token is
  dropped, so its last tokens equal those of the whole text (tests hold it to full tokenization).
  A normaliser that deletes characters could leave the tail short: it then grows, up to the whole text.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from mindie_service.errors import ContextLengthError

Tokenize = Callable[[str], list[int]]

MARGIN_CHARS = 256  # beyond the characters the kept tokens need: room to find a word boundary


@dataclass(frozen=True)
class TextBound:
    max_token_chars: int  # most characters a single token can stand for
    specials: tuple[int, ...]  # what the tokenizer yields for an empty text (its prefix special tokens)

    @classmethod
    def of(cls, tokenizer: Any, tokenize: Tokenize) -> "TextBound | None":
        """From a Hugging Face tokenizer; None when its vocabulary cannot be read (no bound then)."""
        try:
            vocab = tokenizer.get_vocab()
            longest = max(len(t) for t in vocab)
        except Exception:  # noqa: BLE001 - a tokenizer without a readable vocabulary is merely unbounded
            return None
        return cls(max(1, longest), tuple(tokenize("")))

    def refuse_over(self, limit: int) -> int:
        """Characters above which a text cannot fit ``limit`` tokens."""
        return limit * self.max_token_chars


_BOUNDARY = re.compile(r"(?<=\S)\s")


def _boundary(text: str, start: int) -> int:
    """The first position in [start, start + MARGIN_CHARS) where a space follows a non-space (``start``
    if there is none: a text without spaces has no better place to cut)."""
    m = _BOUNDARY.search(text, start, start + MARGIN_CHARS)
    return m.start() if m else start


def tokenize_bounded(tokenize: Tokenize, text: str, bound: TextBound | None, *, keep: int | None,
                     limit: int) -> list[int]:
    """The ids the length rule would see, tokenizing no more of ``text`` than it can keep.

    ``keep``: how many trailing tokens survive (truncate, or the limit under truncation); None when the
    prompt is never cut, so that over ``limit`` it is refused."""
    if bound is None:
        return tokenize(text)
    if keep is None:
        over = bound.refuse_over(limit)
        if len(text) > over:
            raise ContextLengthError(f"Parameter inputs must be at most {limit} tokens (maxInputTokenLen, "
                                     f"maxSeqLen - 1 and the KV pool bound it), got a text of {len(text)} characters "
                                     f"(more than {over} characters cannot fit in {limit} tokens of this tokenizer)")
        return tokenize(text)
    need = keep * bound.max_token_chars + MARGIN_CHARS
    while need < len(text):
        start = _boundary(text, len(text) - need)
        ids = tokenize(text[start:])
        n_sp = len(bound.specials)
        if n_sp and tuple(ids[:n_sp]) == bound.specials:
            ids = ids[n_sp:]
        content = ids[1:]  # the boundary word's first token may differ from the whole text's
        if len(content) >= keep:
            return content[-keep:]
        need *= 2
    return tokenize(text)

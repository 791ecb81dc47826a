"""The n-gram proposer (prompt lookup; MindIE's memory decoding): the longest recent suffix of a sequence
(``prompt_lookup_max`` down to ``prompt_lookup_min`` tokens) found earlier in the same sequence, else in
the recent text of finished requests with the same cache key (adapter, media), proposes the tokens that
followed it. No model, no torch: each sequence keeps an incremental index of its n-grams, so a lookup is
a few dict probes whatever the sequence's length.

Drafts are proposals only: the target verifies every one (engine.spec.speculator), so a draft taken from
another request's text can change no output, only the speed. (The speed is a timing side channel; turn
the memory source off with ``memory: false`` where requests must not learn that others wrote a text.)"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

MEMORY_DOCS = 64  # finished sequences kept per cache key
MEMORY_KEYS = 16  # cache keys (adapters, media) with a memory
MEMORY_DOC_TOKENS = 8192  # the tail of a finished sequence that is kept
# Draft tokens per matched token: a draft's length follows its evidence. A one-token match (common in free
# text) proposes at most 3, a 4-token match up to 12. Replaying greedy outputs of the real instruct model
# (one stream, step cost a + b*T): tokens per forward barely move, the drafted tokens that fail fall by half.
DRAFTS_PER_MATCHED = 3


@dataclass
class NgramIndex:
    """For each n in [lo, hi]: n-gram -> the end position of its latest occurrence in ``tokens[:upto]``."""

    lo: int
    hi: int
    ends: dict[tuple[int, ...], int] = field(default_factory=dict)
    upto: int = 0

    def extend(self, tokens: list[int], upto: int) -> None:
        """Index every n-gram ending at positions ``self.upto + 1 .. upto`` (exclusive ends)."""
        for end in range(max(self.upto + 1, self.lo), upto + 1):
            for n in range(self.lo, min(self.hi, end) + 1):
                self.ends[tuple(tokens[end - n:end])] = end
        self.upto = max(self.upto, upto)

    def lookup(self, tokens: list[int], suffix_end: int) -> tuple[int, int] | None:
        """(match length, end of the earlier occurrence) of the longest suffix of ``tokens[:suffix_end]``
        found in the index; None when none of at least ``lo`` tokens is."""
        for n in range(min(self.hi, suffix_end), self.lo - 1, -1):
            end = self.ends.get(tuple(tokens[suffix_end - n:suffix_end]))
            if end is not None:
                return n, end
        return None


@dataclass
class _Doc:
    tokens: list[int]
    index: NgramIndex


class NgramProposer:
    def __init__(self, lo: int, hi: int, memory: bool) -> None:
        self.lo, self.hi, self.memory_on = lo, hi, memory
        self.memory: OrderedDict[bytes, deque[_Doc]] = OrderedDict()

    def propose(self, tokens: list[int], index: NgramIndex, k: int, cache_key: bytes) -> list[int]:
        """Up to ``k`` draft tokens (and DRAFTS_PER_MATCHED per matched token) to follow ``tokens``; ``index``
        is the sequence's own (kept across steps: extended here to every position but the last, so the suffix
        never matches itself)."""
        if k <= 0 or len(tokens) < self.lo + 1:
            return []
        n = len(tokens)
        index.extend(tokens, n - 1)
        hit = index.lookup(tokens, n)
        if hit is not None:
            return tokens[hit[1]:min(n, hit[1] + k, hit[1] + DRAFTS_PER_MATCHED * hit[0])]
        if not self.memory_on:
            return []
        best: tuple[int, list[int]] | None = None
        for doc in reversed(self.memory.get(cache_key, ())):
            h = doc.index.lookup(tokens, n)
            if h is not None and h[1] < len(doc.tokens) and (best is None or h[0] > best[0]):
                best = (h[0], doc.tokens[h[1]:h[1] + min(k, DRAFTS_PER_MATCHED * h[0])])
                if h[0] >= self.hi:
                    break
        return best[1] if best is not None else []

    def remember(self, tokens: list[int], cache_key: bytes) -> None:
        """Keep a finished sequence's text (its tail) as a source of drafts for later requests."""
        if not self.memory_on or len(tokens) <= self.lo:
            return
        tail = tokens[-MEMORY_DOC_TOKENS:]
        idx = NgramIndex(self.lo, self.hi)
        idx.extend(tail, len(tail))
        docs = self.memory.setdefault(cache_key, deque(maxlen=MEMORY_DOCS))
        self.memory.move_to_end(cache_key)
        docs.append(_Doc(tail, idx))
        while len(self.memory) > MEMORY_KEYS:
            self.memory.popitem(last=False)

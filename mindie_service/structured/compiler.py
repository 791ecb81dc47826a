"""The compile cache: one compiled grammar per (tokenizer, grammar text), kept LRU and bounded, shared by the
input processor (which compiles off the IO loop, in its pool, so a bad grammar is refused before the engine
sees the request) and the engine (which copies the cached start matcher for each request)."""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

from mindie_service.structured.backend import CompiledGrammar, GrammarBackend, Matcher, StructuredLimits
from mindie_service.structured.grammar_spec import StructuredSpec

logger = logging.getLogger(__name__)


@dataclass
class CompileStats:
    hits: int = 0
    misses: int = 0
    compile_ms: float = 0.0  # total time spent compiling (misses)

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0


class GrammarCompiler:
    """Thread-safe: the processor's pool threads and the engine thread share it. Two threads missing on one
    grammar at once may both compile it (the result is the same; the second replaces the first)."""

    def __init__(self, backend: GrammarBackend, limits: StructuredLimits) -> None:
        self.backend = backend
        self.limits = limits
        self.stats = CompileStats()
        self._cache: OrderedDict[tuple[str, str, bool], CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def vocab_size(self) -> int:
        return self.backend.vocab_size

    def compile(self, spec: StructuredSpec) -> CompiledGrammar:
        """The compiled grammar (ValidationError naming ``spec.where`` and the reason when it is refused)."""
        with self._lock:
            got = self._cache.get(spec.key)
            if got is not None:
                self._cache.move_to_end(spec.key)
                self.stats.hits += 1
                return got
            self.stats.misses += 1
        compiled = self.backend.compile(spec)  # refused grammars are not cached: each refusal re-validates
        with self._lock:
            self.stats.compile_ms += compiled.compile_ms
            self._cache[spec.key] = compiled
            while len(self._cache) > max(1, self.limits.cache_size):
                self._cache.popitem(last=False)
        return compiled

    def matcher(self, spec: StructuredSpec) -> Matcher:
        return self.backend.new_matcher(self.compile(spec))

    def fill_masks(self, rows: Sequence[tuple[Matcher, int]], masks: Any) -> None:
        self.backend.fill_masks(rows, masks)

    def fill_draft_masks(self, rows: Sequence[tuple[Matcher, int, list[int]]], masks: Any) -> None:
        self.backend.fill_draft_masks(rows, masks)


def build_compiler(hf_tokenizer: Any, eos_token_ids: Sequence[int], limits: StructuredLimits,
                   vocab_size: int | None = None) -> GrammarCompiler | None:
    """The compiler for a model's tokenizer, or None where it cannot have one (no fast tokenizer: the
    StandardMock's bytes); structured requests are then refused by name."""
    if hf_tokenizer is None or not getattr(hf_tokenizer, "is_fast", False):
        return None
    from mindie_service.structured.llg_backend import LlgBackend

    try:
        return GrammarCompiler(LlgBackend(hf_tokenizer, eos_token_ids, limits, vocab_size), limits)
    except Exception as e:  # noqa: BLE001 - a tokenizer llguidance cannot read: serve without structured output
        logger.warning("structured output is off for this model: llguidance cannot use its tokenizer (%s)", e)
        return None

"""The compile cache: one compiled grammar per (tokenizer, grammar text), kept LRU and bounded, shared by the
input processor (which compiles off the IO loop, in its pool, so a bad grammar is refused before the engine
sees the request) and the engine (which copies the cached start matcher for each request).

The backend itself (llguidance's token table: ~30 MB and about a second on a 49k vocabulary) is built by the first
request that asks for structured output, once per model (``LazyBackend``): a serve that never gets one never pays."""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from mindie_service.errors import ValidationError

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


class LazyBackend:
    """A ``GrammarBackend`` built by its first use (``build``), once, under a lock (the processor's pool threads
    and the engine thread may ask at once). A build that fails is logged once and every structured request is
    then refused by name, as for a model without a fast tokenizer."""

    def __init__(self, build: Callable[[], GrammarBackend], name: str) -> None:
        self.name = name
        self._build = build
        self._backend: GrammarBackend | None = None
        self._failed: str | None = None
        self._lock = threading.Lock()

    @property
    def built(self) -> bool:
        return self._backend is not None

    def get(self, where: str) -> GrammarBackend:
        """The backend, built now if this is its first use; ValidationError naming ``where`` if it cannot be."""
        backend = self._backend
        if backend is not None:
            return backend
        with self._lock:
            if self._backend is None and self._failed is None:
                t0 = time.perf_counter()
                try:
                    self._backend = self._build()
                except Exception as e:  # noqa: BLE001 - a tokenizer the library cannot read: refuse by name
                    self._failed = str(e)
                    logger.warning("structured output is off for this model: %s cannot use its tokenizer (%s)",
                                   self.name, e)
                else:
                    logger.info("built %s's token table for structured output in %.0f ms (first request)",
                                self.name, (time.perf_counter() - t0) * 1000)
            if self._backend is None:
                raise ValidationError(f"Parameter {where} must be absent: structured output is off for this model "
                                      f"({self.name} cannot use its tokenizer: {self._failed})")
            return self._backend

    @property
    def vocab_size(self) -> int:
        return self.get("structured output").vocab_size

    def compile(self, spec: StructuredSpec) -> CompiledGrammar:
        return self.get(spec.where).compile(spec)

    def new_matcher(self, compiled: CompiledGrammar) -> Matcher:
        return self.get(compiled.spec.where).new_matcher(compiled)

    def fill_masks(self, rows: Sequence[tuple[Matcher, int]], masks: Any) -> None:
        self.get("structured output").fill_masks(rows, masks)

    def fill_draft_masks(self, rows: Sequence[tuple[Matcher, int, list[int]]], masks: Any) -> None:
        self.get("structured output").fill_draft_masks(rows, masks)


def build_compiler(hf_tokenizer: Any, eos_token_ids: Sequence[int], limits: StructuredLimits,
                   vocab_size: int | None = None) -> GrammarCompiler | None:
    """The compiler for a model's tokenizer, or None where it cannot have one (no fast tokenizer: the
    StandardMock's bytes); structured requests are then refused by name. Nothing is built (llguidance is not even
    imported) until the first structured request."""
    if hf_tokenizer is None or not getattr(hf_tokenizer, "is_fast", False):
        return None
    eos = tuple(eos_token_ids)

    def build() -> GrammarBackend:
        from mindie_service.structured.llg_backend import LlgBackend
        return LlgBackend(hf_tokenizer, eos, limits, vocab_size)

    return GrammarCompiler(LazyBackend(build, "llguidance"), limits)

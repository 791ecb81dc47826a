"""The one small interface the engine and the input processor use, whatever grammar library is behind it.

    compiled = backend.compile(spec)       validate + compile (raises ValidationError with the library's reason)
    m = backend.new_matcher(compiled)      a fresh matcher at the grammar's start
    backend.fill_masks([(m, row)], masks)  allowed-token bitmasks of many matchers at once (int32 words, bit i of
                                           word w: token 32 w + i), in native code, off the GIL
    backend.fill_draft_masks([(m, row, drafts)], masks)
                                           speculative decoding: row gets m's mask, row + i + 1 the mask after
                                           drafts[:i + 1] (m advanced through them and rolled back, natively)
    m.validate(tokens)                     how many of ``tokens``, in order, the grammar allows (no state change)
    m.consume(t) / m.rollback(n)           advance / go back
    m.is_done() / m.is_accepting()         only EOS left / the grammar may end here
    m.forced_tokens()                      the canonical tokens of the bytes the grammar forces next
    m.error()                              None, or why the matcher failed (it never raises on its own input)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from mindie_service.structured.grammar_spec import StructuredSpec


@dataclass(frozen=True)
class StructuredLimits:
    """Bounds on compiling and matching (config ``ModelDeployConfig.structuredOutput``), so that a
    pathological schema or regex is refused in bounded time and memory, never a frozen engine.
    The lexer and parser limits are llguidance's (its own defaults in brackets)."""

    max_lexer_states: int = 50_000  # regex automaton states, ~1-2 kB each [250k]
    initial_lexer_fuel: int = 1_000_000  # compile-time regex work, ~50k/ms [1M]
    step_lexer_fuel: int = 200_000  # per-token lexer work, ~14k/ms [200k]
    step_max_items: int = 50_000  # Earley items per token [50k]
    max_items_in_row: int = 2_000  # [2000]
    max_grammar_size: int = 500_000  # grammar symbols [500k]
    cache_size: int = 256  # compiled grammars kept (LRU)
    threads: int = 0  # mask-fill threads; 0: the library's default
    forced_runs: bool = True  # append grammar-forced tokens without sampling (one chunk next step)
    overlap_fill: bool = False  # fill the step's missing masks on a thread during the forward (conf/README.md)
    tool_call_parser: str = ""  # the tool-call format (structured.tool_formats); "": found from the chat template
    reasoning_parser: str = ""  # thinking markers (engine.output.reasoning); "": found from the template; "none"


@dataclass(frozen=True)
class CompiledGrammar:
    """A validated grammar for one tokenizer: ``template`` is the backend's start matcher (copied per request)."""

    spec: StructuredSpec
    template: Any
    compile_ms: float


class Matcher(Protocol):
    def consume(self, token: int) -> bool: ...

    def rollback(self, num_tokens: int) -> bool: ...

    def validate(self, tokens: list[int]) -> int: ...

    def is_done(self) -> bool: ...

    def is_accepting(self) -> bool: ...

    def forced_tokens(self) -> list[int]: ...

    def error(self) -> str | None: ...


class GrammarBackend(Protocol):
    name: str
    vocab_size: int  # the tokenizer's; masks have ceil(vocab_size / 32) int32 words

    def compile(self, spec: StructuredSpec) -> CompiledGrammar: ...

    def new_matcher(self, compiled: CompiledGrammar) -> Matcher: ...

    def fill_masks(self, rows: Sequence[tuple[Matcher, int]], masks: Any) -> None: ...

    def fill_draft_masks(self, rows: Sequence[tuple[Matcher, int, list[int]]], masks: Any) -> None: ...

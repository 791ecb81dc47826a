"""llguidance behind ``backend.GrammarBackend``: its tokenizer built from the loaded fast tokenizer
(``llguidance.hf.from_tokenizer``: a GGUF model has no tokenizer.json on disk), grammars from JSON Schema
(compact by default: ``whitespace_flexible`` false), regex, choice and Lark, validated before use (a matcher
never raises: it enters an error state, so the refusal carries the library's reason), and the batched mask
fill of its executor (native threads, the GIL released)."""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Sequence

import llguidance
import llguidance.hf
from llguidance import LLExecutor, LLMatcher, LLParserLimits

from mindie_service.errors import ValidationError
from mindie_service.structured.backend import CompiledGrammar, Matcher, StructuredLimits
from mindie_service.structured.grammar_spec import StructuredSpec

logger = logging.getLogger(__name__)
_SCHEMA_ERROR_MAX = 600  # characters of the library's reason quoted in a refusal
_NAMES = {"json": "JSON Schema", "regex": "regular expression", "choice": "list of choices", "grammar": "Lark grammar"}


class LlgMatcher:
    """One request's matcher (an LLMatcher) as ``backend.Matcher``."""

    __slots__ = ("m",)

    def __init__(self, m: LLMatcher) -> None:
        self.m = m

    def consume(self, token: int) -> bool:
        return bool(self.m.consume_token(token))

    def rollback(self, num_tokens: int) -> bool:
        return bool(self.m.rollback(num_tokens))

    def validate(self, tokens: list[int]) -> int:
        return int(self.m.validate_tokens(tokens))

    def is_done(self) -> bool:
        return bool(self.m.is_stopped())

    def is_accepting(self) -> bool:
        return bool(self.m.is_accepting())

    def forced_tokens(self) -> list[int]:
        return list(self.m.compute_ff_tokens())

    def error(self) -> str | None:
        return self.m.get_error() or None if self.m.is_error() else None


def _lark_choice(choices: list[str]) -> str:
    return "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def grammar_text(spec: StructuredSpec) -> str:
    """The llguidance grammar of ``spec`` (not yet validated)."""
    if spec.kind == "json":
        opts: Any = {"whitespace_flexible": spec.whitespace_flexible}
        try:
            return LLMatcher.grammar_from_json_schema(spec.source, overrides=opts)
        except ValueError as e:
            raise ValidationError(f"Parameter {spec.where} must be a valid JSON Schema: {e}") from None
    if spec.kind == "regex":
        return LLMatcher.grammar_from_regex(spec.source)
    if spec.kind == "choice":
        return LLMatcher.grammar_from_lark(_lark_choice(json.loads(spec.source)))
    return LLMatcher.grammar_from_lark(spec.source)


class LlgBackend:
    """llguidance for one tokenizer (``hf_tokenizer``: a fast Hugging Face tokenizer)."""

    name = "llguidance"

    def __init__(self, hf_tokenizer: Any, eos_token_ids: Sequence[int], limits: StructuredLimits,
                 vocab_size: int | None = None) -> None:
        if vocab_size is not None and vocab_size < len(hf_tokenizer):
            vocab_size = None  # the model's rows are fewer than the tokenizer's ids: masks cover the tokenizer's
        self.tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size,
                                                      eos_token=sorted(eos_token_ids) or None)
        self.vocab_size = int(vocab_size or self.tokenizer.vocab_size)
        self.limits = limits
        self._executor = LLExecutor(limits.threads or None)

    def _parser_limits(self) -> LLParserLimits:
        lim = self.limits
        return LLParserLimits(max_items_in_row=lim.max_items_in_row, initial_lexer_fuel=lim.initial_lexer_fuel,
                              step_lexer_fuel=lim.step_lexer_fuel, step_max_items=lim.step_max_items,
                              max_lexer_states=lim.max_lexer_states, max_grammar_size=lim.max_grammar_size,
                              verbose_errors=False)

    def compile(self, spec: StructuredSpec) -> CompiledGrammar:
        """Validate and build the start matcher (the GIL is released while llguidance builds it); a grammar
        over the limits is refused with the library's reason, in the time the limits allow."""
        t0 = time.perf_counter()
        g = grammar_text(spec)
        is_error, msgs = LLMatcher.validate_grammar_with_warnings(g, self.tokenizer, limits=self._parser_limits())
        if is_error:
            self._blame_part(spec)
            raise ValidationError(f"Parameter {spec.where} must be a valid "
                                  f"{_NAMES[spec.kind]}: {_short(msgs[0] if msgs else 'invalid')}")
        m = LLMatcher(self.tokenizer, g, log_level=0, limits=self._parser_limits())
        if m.is_error():
            self._blame_part(spec)
            raise ValidationError(f"Parameter {spec.where} must be a grammar within the server's limits: "
                                  f"{_short(m.get_error())}")
        ms = (time.perf_counter() - t0) * 1000
        logger.debug("compiled a %s grammar in %.1f ms", spec.kind, ms)
        return CompiledGrammar(spec, m, ms)

    def _blame_part(self, spec: StructuredSpec) -> None:
        """A refused grammar built from the request's schemas (``spec.parts``): the first schema refused alone
        is named (``tools[1].function.parameters``), with its reason, instead of the grammar the server built."""
        for where, source in spec.parts:
            self.compile(StructuredSpec("json", source, where))  # raises naming ``where`` when this one is bad
        if spec.parts:  # each schema is fine alone: their combination is what is refused
            raise ValidationError(f"Parameter {spec.where} must hold schemas the server can enforce together "
                                  f"(each is valid alone; together they pass the grammar limits)")

    def new_matcher(self, compiled: CompiledGrammar) -> LlgMatcher:
        return LlgMatcher(compiled.template.deep_copy())

    def fill_masks(self, rows: Sequence[tuple[Matcher, int]], masks: Any) -> None:
        """``masks``: a contiguous int32 CPU tensor [batch, words]; row ``i`` of each pair gets its matcher's mask."""
        assert masks.is_contiguous() and masks.dtype.itemsize == 4
        pairs = [(m.m, i) for m, i in rows]  # type: ignore[attr-defined]
        self._executor.unsafe_compute_mask_ptr(pairs, masks.data_ptr(), masks.shape[1] * 4, masks.shape[0])

    def fill_draft_masks(self, rows: Sequence[tuple[Matcher, int, list[int]]], masks: Any) -> None:
        """Row ``i`` gets its matcher's mask and rows ``i + 1 ..`` the masks after each of its draft tokens (the
        drafts must be ones the grammar allows: past a refused one the rows are left as they are)."""
        assert masks.is_contiguous() and masks.dtype.itemsize == 4
        trips = [(m.m, i, list(d)) for m, i, d in rows]  # type: ignore[attr-defined]
        self._executor.unsafe_compute_mask_ptr_with_draft_token(trips, masks.data_ptr(), masks.shape[1] * 4,
                                                                masks.shape[0])


def _short(msg: str) -> str:
    msg = " ".join(msg.split())
    return msg if len(msg) <= _SCHEMA_ERROR_MAX else msg[:_SCHEMA_ERROR_MAX] + "..."

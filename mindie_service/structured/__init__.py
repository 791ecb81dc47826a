"""Structured output: grammars (JSON Schema, regex, choice, Lark) compiled once per (tokenizer, grammar text) and
matchers that say which tokens may come next, behind one small interface (``backend.GrammarBackend``) so another
library could sit behind it. llguidance is today's backend (``llg_backend``). ``spec`` (what a request asks for)
is plain data and imports no grammar library: the sampling parameters carry it."""

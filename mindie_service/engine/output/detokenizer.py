"""Incremental detokenization with stop strings.

Text is decoded from a sliding window of ids (prefix/read offsets, as vLLM and TGI do), so a
UTF-8 character split across byte-level tokens is held back until complete: no U+FFFD is ever
emitted. Stop strings are searched across token boundaries; text that could still be the start
of a stop string is held back, so the stop text never leaks into a stream."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PROMPT_CONTEXT = 5  # prompt tokens decoded before the first output token, for correct spacing


class TokenDecoder:
    """Decodes id windows with the fast backend tokenizer (no per-call Python wrapper cost)."""

    def __init__(self, tokenizer: Any) -> None:
        self.backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
        self.tokenizer = tokenizer
        self.special_ids = frozenset(int(i) for i in getattr(tokenizer, "all_special_ids", []))

    def decode(self, ids: list[int], keep: frozenset[int] = frozenset()) -> str:
        """The text of ``ids``, special tokens skipped except those in ``keep`` (written as their text)."""
        if keep and not keep.isdisjoint(ids):
            cuts = [i for i, t in enumerate(ids) if t in keep]
            parts, start = [], 0
            for c in cuts:
                parts += [self.decode(ids[start:c]), self.tokenizer.convert_ids_to_tokens(ids[c])]
                start = c + 1
            return "".join(parts) + self.decode(ids[start:])
        if self.backend is not None:
            return self.backend.decode(ids, skip_special_tokens=True)
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        """The text one token stands for alone (for details/logprob entries)."""
        return self.decode([token_id]) if token_id not in self.special_ids else self.tokenizer.convert_ids_to_tokens(token_id)


@dataclass
class DetokState:
    ids: list[int]  # prompt tail + output ids
    prefix_offset: int
    read_offset: int
    text: str = ""  # output text decoded so far (stop text not yet trimmed)
    emitted: int = 0  # characters of ``text`` already handed out
    stops: tuple[str, ...] = ()
    holdback: int = 0
    stopped: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    keep: frozenset[int] = frozenset()  # special tokens whose text this output keeps (a tool call's marker)

    @classmethod
    def start(cls, prompt_ids: list[int], stops: list[str], keep: tuple[int, ...] = ()) -> "DetokState":
        tail = list(prompt_ids[-PROMPT_CONTEXT:])
        hold = max((len(s) for s in stops), default=1) - 1
        return cls(ids=tail, prefix_offset=0, read_offset=len(tail), stops=tuple(stops), holdback=hold,
                   keep=frozenset(keep))


def step(dec: TokenDecoder, st: DetokState, token_id: int) -> str:
    """Feed one output token; returns the new text that may be shown now.

    Sets ``st.stopped`` when a stop string completed (the text is then cut before it)."""
    st.ids.append(token_id)
    prefix = dec.decode(st.ids[st.prefix_offset:st.read_offset], st.keep)
    full = dec.decode(st.ids[st.prefix_offset:], st.keep)
    if len(full) > len(prefix) and not full.endswith("\ufffd"):
        new = full[len(prefix):]
        st.prefix_offset, st.read_offset = st.read_offset, len(st.ids)
        before = len(st.text)
        st.text += new
        if st.stops:
            start = max(0, before - st.holdback)
            cut = min((i for i in (st.text.find(s, start) for s in st.stops) if i >= 0), default=-1)
            if cut >= 0:
                st.text = st.text[:cut]
                st.stopped = True
    limit = len(st.text) if st.stopped else len(st.text) - st.holdback
    if limit <= st.emitted:
        return ""
    out = st.text[st.emitted:limit]
    st.emitted = limit
    return out


def flush(dec: TokenDecoder, st: DetokState) -> str:
    """At the end of a request: the text held back for stop matching. Pending bytes are decoded
    too, except a trailing character that never completed (generation stopped mid-character):
    half a character is never emitted."""
    if not st.stopped and st.read_offset < len(st.ids):
        prefix = dec.decode(st.ids[st.prefix_offset:st.read_offset], st.keep)
        st.text += dec.decode(st.ids[st.prefix_offset:], st.keep)[len(prefix):].rstrip("\ufffd")
        st.read_offset = len(st.ids)
    out = st.text[st.emitted:]
    st.emitted = len(st.text)
    return out

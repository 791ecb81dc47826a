"""One tool-call parser for the stream and the whole answer: text in (any chunking), content and tool-call
deltas out. The non-streamed answer is the same parser fed the whole text at once, so the two cannot
disagree: its decisions depend on the text seen, never on where a chunk ended (a marker cut in two is held
back; a call's header is sent only once its name string and the arguments key are complete; its arguments
stream raw as they arrive, up to the end of their JSON value)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from mindie_service.structured.tool_formats import ToolFormat

_HEADER = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(arguments|parameters)"\s*:')
_WS = " \t\r\n"


@dataclass
class ToolCallDelta:
    index: int
    id: str | None = None  # with the name, on the call's first delta
    name: str | None = None
    arguments: str = ""


@dataclass
class ParsedCall:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass
class _Call:
    start: int
    args_start: int | None = None  # where the arguments value begins (its first non-space character)
    args_sent: int = 0  # how much of it has been sent
    header_sent: bool = False
    name: str = ""


def value_end(s: str, i: int) -> int | None:
    """The index just past the JSON value starting at ``s[i]`` (a non-space), or None while it is incomplete."""
    c = s[i]
    if c in "{[":
        depth, in_str, esc = 0, False, False
        for k in range(i, len(s)):
            ch = s[k]
            if in_str:
                esc, in_str = (False, in_str) if esc else (ch == "\\", ch != '"')
                continue
            if ch == '"':
                in_str = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    return k + 1
        return None
    if c == '"':
        esc = False
        for k in range(i + 1, len(s)):
            if esc:
                esc = False
            elif s[k] == "\\":
                esc = True
            elif s[k] == '"':
                return k + 1
        return None
    m = re.compile(r"[^,}\]\s]*").match(s, i)
    return m.end() if m and m.end() < len(s) else None


@dataclass
class ToolCallParser:
    fmt: ToolFormat
    id_prefix: str = "call_"
    buf: str = ""
    pos: int = 0
    state: str = ""
    calls: list[ParsedCall] = field(default_factory=list)
    content: str = ""
    _cur: _Call | None = None

    def __post_init__(self) -> None:
        self.state = self.state or ("start" if self.fmt.bare_json else "content")

    def feed(self, text: str, final: bool = False) -> tuple[str, list[ToolCallDelta]]:
        """Content and call deltas that ``text`` completes (``final``: the text ends here: flush)."""
        items = self.feed_ordered(text, final)
        return "".join(i for i in items if isinstance(i, str)), [i for i in items if not isinstance(i, str)]

    def feed_ordered(self, text: str, final: bool = False) -> list[str | ToolCallDelta]:
        """The same, content pieces and call deltas in the order the text holds them (Anthropic's content blocks
        keep that order: text, a call, more text)."""
        self.buf += text
        items: list[Any] = []
        while getattr(self, "_" + self.state)(items, items, final):  # one list: both kinds, in order
            pass
        self.content += "".join(i for i in items if isinstance(i, str))
        return [i for i in items if not isinstance(i, str) or i]

    # -- states: each returns True when it moved on (run again), False when it waits for more text ------
    def _skip_ws(self) -> int | None:
        k = self.pos
        while k < len(self.buf) and self.buf[k] in _WS:
            k += 1
        return k if k < len(self.buf) else None

    def _call_or(self, otherwise: str, final: bool) -> bool:
        """After whitespace: a ``{`` opens a call; anything else (or the end of the text) moves to ``otherwise``
        (the end of the text waiting for more unless ``final``, when it ends as content)."""
        k = self._skip_ws()
        if k is None:
            if final:
                self.state = "content"
                return True
            return False
        if self.buf[k] == "{":
            self.pos, self.state, self._cur = k, "in_call", _Call(k)
        else:
            self.state = otherwise
        return True

    def _start(self, out: list[str], deltas: list[ToolCallDelta], final: bool) -> bool:
        return self._call_or("content", final)

    def _content(self, out: list[str], deltas: list[ToolCallDelta], final: bool) -> bool:
        mark = self.fmt.open
        i = self.buf.find(mark, self.pos)
        if i >= 0:
            out.append(self.buf[self.pos:i])
            self.pos, self.state = i + len(mark), "list_open" if self.fmt.list_open else "call_ws"
            return True
        keep = 0 if final else next((n for n in range(min(len(mark) - 1, len(self.buf) - self.pos), 0, -1)
                                     if self.buf.endswith(mark[:n])), 0)
        out.append(self.buf[self.pos:len(self.buf) - keep])
        self.pos = len(self.buf) - keep
        return False

    def _expect(self, token: str, then: str, final: bool, out: list[str]) -> bool | None:
        """Skip spaces, then ``token``: True moved on, False waiting, None not there."""
        k = self._skip_ws()
        if k is None:
            return None if final else False
        rest = self.buf[k:k + len(token)]
        if rest == token:
            self.pos, self.state = k + len(token), then
            return True
        if token.startswith(rest) and not final:
            return False
        return None

    def _list_open(self, out: list[str], deltas: list[ToolCallDelta], final: bool) -> bool:
        got = self._expect(self.fmt.list_open, "call_ws", final, out)
        if got is None:
            self.state = "content"
            return True
        return got

    def _call_ws(self, out: list[str], deltas: list[ToolCallDelta], final: bool) -> bool:
        return self._call_or("after", final)

    def _id(self, index: int) -> str:
        return f"{self.id_prefix}{index}"

    def _header(self, c: _Call, deltas: list[ToolCallDelta]) -> None:
        """Send the call's id and name once its name string and the arguments key are complete."""
        m = _HEADER.match(self.buf, c.start)
        if m is None:
            return
        k = m.end()
        while k < len(self.buf) and self.buf[k] in _WS:
            k += 1
        if k == len(self.buf):
            return  # the arguments' first character decides where they begin
        try:
            c.name = json.loads(f'"{m.group(1)}"')
        except ValueError:
            c.name = m.group(1)
        c.args_start = c.args_sent = k
        c.header_sent = True
        deltas.append(ToolCallDelta(len(self.calls), self._id(len(self.calls)), c.name))

    def _in_call(self, out: list[str], deltas: list[ToolCallDelta], final: bool) -> bool:
        c, b = self._cur, self.buf
        assert c is not None
        if not c.header_sent:
            self._header(c, deltas)
        if c.header_sent and c.args_start is not None:
            end = value_end(b, c.args_start)
            upto = end if end is not None else len(b)
            if upto > c.args_sent:
                deltas.append(ToolCallDelta(len(self.calls), arguments=b[c.args_sent:upto]))
                c.args_sent = upto
        end_obj = value_end(b, c.start)
        if end_obj is None and not final:
            return False
        if c.header_sent and c.args_start is not None:
            self._done(c.name, b[c.args_start:c.args_sent], end_obj)
            return True
        if end_obj is not None:
            parsed = self._whole_call(b[c.start:end_obj])
            if parsed is not None:
                i = len(self.calls)
                deltas += [ToolCallDelta(i, self._id(i), parsed[0]), ToolCallDelta(i, arguments=parsed[1])]
                self._done(parsed[0], parsed[1], end_obj)
                return True
        out.append(b[c.start:end_obj])  # not a call after all: it is content
        self.pos, self.state, self._cur = end_obj or len(b), "content", None
        return True

    def _whole_call(self, text: str) -> tuple[str, str] | None:
        """(name, arguments JSON) of a call whose keys came in another order; None if it is not a call."""
        try:
            obj = json.loads(text)
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = next((obj[k] for k in (self.fmt.args_key, "arguments", "parameters") if k in obj), {})
        return obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False,
                                                                          separators=(",", ":"))

    def _done(self, name: str, arguments: str, end: int | None) -> None:
        self.calls.append(ParsedCall(self._id(len(self.calls)), name, arguments))
        self.pos, self.state, self._cur = end if end is not None else len(self.buf), "after", None

    def _after(self, out: list[str], deltas: list[ToolCallDelta], final: bool) -> bool:
        f = self.fmt
        for token, then in ((f.close, "content"), (f.sep.strip(), "call_ws")):
            if not token or (then == "call_ws" and f.per_call_wrap):
                continue
            got = self._expect(token, then, final, out)
            if got is not None:
                return got
        self.state = "content"
        return True

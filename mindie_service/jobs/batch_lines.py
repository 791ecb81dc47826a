"""An OpenAI batch's input lines and the endpoints they may call.

Each line is ``{"custom_id", "method", "url", "body"}``. A line that does not validate is answered in the error
file with OpenAI's error object (``{"code", "message"}``) and the others run; a ``custom_id`` used twice fails
the whole batch, as OpenAI's validation does (``duplicate_custom_id``, naming the line).

``BatchEndpoints`` is the table of URLs a batch may name, each with the function that answers one line the way
its online route would: the server registers its routes (server/batch_routes.py: chat, completions, responses and
embeddings)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable


@dataclass(frozen=True)
class LineCall:
    """One line's request as its route gets it: ``owner`` is the batch's (stored objects belong to it)."""

    body: dict[str, Any]
    request_id: str
    owner: str


@dataclass(frozen=True)
class LineReply:
    """What the online route would have answered: its status and JSON body."""

    status_code: int
    body: Any


LineFn = Callable[[LineCall], Awaitable[LineReply]]


class BatchEndpoints:
    def __init__(self) -> None:
        self._fns: dict[str, LineFn] = {}

    def register(self, url: str, fn: LineFn) -> None:
        self._fns[url] = fn

    def get(self, url: str) -> LineFn | None:
        return self._fns.get(url)

    def urls(self) -> list[str]:
        return sorted(self._fns)


def count_lines(path: Path) -> int:
    """The requests in a JSONL file (its non-blank lines), read a line at a time."""
    with open(path, "rb") as f:
        return sum(1 for ln in f if ln.strip())


@dataclass(frozen=True)
class BatchLine:
    line: int  # 0-based among the file's non-blank lines
    custom_id: str
    body: dict[str, Any]


@dataclass(frozen=True)
class LineError:
    line: int
    custom_id: str | None
    code: str
    message: str

    def error(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def _check(obj: Any, endpoint: str) -> tuple[str, str] | None:
    """(code, message) of what is wrong with a parsed line; None when it is good."""
    if not isinstance(obj, dict):
        return "invalid_json_line", "The line must be a JSON object {custom_id, method, url, body}."
    extra = sorted(set(obj) - {"custom_id", "method", "url", "body"})
    if extra:
        return "invalid_request", f"Unknown field(s) in the line: {', '.join(extra)}."
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid:
        return "missing_custom_id", "custom_id must be a non-empty string."
    if obj.get("method") != "POST":
        return "invalid_method", f"method must be POST, got {obj.get('method')!r}."
    if obj.get("url") != endpoint:
        return "invalid_url", f"url must be the batch's endpoint {endpoint}, got {obj.get('url')!r}."
    if not isinstance(obj.get("body"), dict):
        return "invalid_body", "body must be a JSON object (the request the endpoint takes)."
    return None


def validate_lines(raw: list[bytes], endpoint: str) -> tuple[list[BatchLine], list[LineError], list[dict[str, Any]]]:
    """(good lines, bad lines, the errors failing the whole batch: duplicate custom_ids, OpenAI's shape)."""
    good: list[BatchLine] = []
    bad: list[LineError] = []
    seen: dict[str, int] = {}
    fatal: list[dict[str, Any]] = []
    for n, text in enumerate(raw):
        try:
            obj = json.loads(text.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            bad.append(LineError(n, None, "invalid_json_line", f"The line is not valid JSON: {e}."))
            continue
        problem = _check(obj, endpoint)
        cid = obj.get("custom_id") if isinstance(obj, dict) and isinstance(obj.get("custom_id"), str) else None
        cid = cid or None
        if cid is not None:
            if cid in seen:
                fatal.append({"code": "duplicate_custom_id", "line": n + 1, "param": "custom_id", "message":
                              "The custom_id for this request is a duplicate of another request (line "
                              f"{seen[cid] + 1}). The custom_id parameter must be unique for each request in a batch."})
            seen.setdefault(cid, n)
        if problem is not None:
            bad.append(LineError(n, cid, *problem))
        else:
            good.append(BatchLine(n, obj["custom_id"], obj["body"]))
    return good, bad, fatal

"""The table tools/bench_gguf.py prints: one line per file and engine, printed (and written to the markdown file)
as soon as that file is measured, so a long run shows its rows as they come and a stopped one keeps them.

Columns: the file's size, the weight bytes one decode token reads and the bandwidth bound they give at the triad
measured just before; one stream's decode rate and its share of that bound; N streams; the 512-token prefill; our
KV pool (bytes and tokens); resident memory before the load (the interpreter and its imports), after it and at the
end against issue 44's goal, file size + KV pool + 300 MB (ours only: llama.cpp maps the file and sizes its own
context). Ratios in brackets are ours against
llama.cpp on the same file (above 1: ours is better; prefill: the ratio of its time to ours). With several one-stream
rounds the decode and prefill cells are their median [min-max, n] and the ratio the median of the paired per-round
ratios."""
from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from pathlib import Path
from typing import Any

MB = 1e6
GOAL_SLACK = 300 * MB  # issue 44: RSS after load <= file size + KV pool + 300 MB


def mb(n: float) -> str:
    return f"{n / MB:.1f}" if n < 10 * MB else f"{n / MB:.0f}"


def fmt_ratio(a: float | None, b: float | None, higher_better: bool = True) -> str:
    if not a or not b:
        return ""
    return f"{(a / b if higher_better else b / a):.2f}x"


def memory_goal(r: dict[str, Any], e: dict[str, Any]) -> float:
    return r.get("file_bytes", 0) + e.get("kv_bytes", 0) + GOAL_SLACK


def verdict(r: dict[str, Any], e: dict[str, Any]) -> str:
    """RSS after load, and at the end (every weight touched, the KV pool used), against the goal."""
    goal = memory_goal(r, e)
    return "/".join("pass" if e.get(k, 0) <= goal else "FAIL" for k in ("rss_load", "rss_end"))


def rounds_cell(e: dict[str, Any], peer: dict[str, Any] | None, key: str, higher: bool = True) -> str:
    """A figure measured in rounds (bench_gguf's --stream-rounds): the median, the median of the paired per-round
    ratios against the peer (above 1: ours is better), and the rounds' min-max."""
    got = e[f"{key}_rounds"]
    cell = f"{median(got):.2f}"
    theirs = (peer or {}).get(f"{key}_rounds")
    if theirs and len(theirs) == len(got):
        cell += f" ({median(a / b if higher else b / a for a, b in zip(got, theirs)):.2f}x paired)"
    return cell + f" [{min(got):.2f}-{max(got):.2f}, n={len(got)}]"


def bound_share(r: dict[str, Any], e: dict[str, Any]) -> str:
    """The median over the rounds of each round's decode over that round's own triad bound."""
    got, triads = e["decode_rounds"], r.get("triad_rounds", [])
    if not r.get("bytes") or len(triads) != len(got):
        return ""
    return f"{median(d * r['bytes'] / (t * 1e9) for d, t in zip(got, triads)):.0%}"


@dataclass
class Table:
    counts: list[int]
    prefill: int
    markdown: Path | None = None
    preface: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def head(self) -> list[str]:
        cols = ["file", "engine", "file MB", "MB/token", "triad GB/s", "bound tok/s", "1 stream decode tok/s",
                "of bound", *[f"{n} streams tok/s" for n in self.counts], f"prefill {self.prefill} s",
                "KV pool MB (tokens)", "RSS before load MB", "RSS load MB", "RSS end MB", "goal MB (file + KV + 300)",
                "RSS load/end <= goal"]
        return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]

    def start(self, preface: list[str]) -> None:
        self.preface = preface
        for line in [*preface, "", *self.head()]:
            print(line, flush=True)
        self._write()

    def add(self, r: dict[str, Any]) -> None:
        """One measured file's lines: printed now, and the markdown file rewritten with every line so far."""
        for eng in ("ours", "llama.cpp"):
            if r.get(eng):
                line = self._line(r, eng)
                self.lines.append(line)
                print(line, flush=True)
        self._write()

    def finish(self, footer: list[str]) -> None:
        for line in footer:
            print(line, flush=True)
        self._write(footer)

    def _write(self, footer: list[str] | None = None) -> None:
        if self.markdown is not None:
            text = "\n\n".join(self.preface) + "\n\n" + "\n".join([*self.head(), *self.lines, "", *(footer or [])])
            self.markdown.write_text(text + "\n", encoding="utf-8")

    def _line(self, r: dict[str, Any], eng: str) -> str:
        e = r[eng]
        if "error" in e:
            return f"| {r['file']} | {eng} | error: {' '.join(e['error'].split())[-300:]} |"
        peer = r.get("llama.cpp") if eng == "ours" else None
        ok_peer = peer is not None and "error" not in peer

        def cell(key: str, higher: bool = True) -> str:
            v = e.get(key)
            if v is None:
                return ""
            ratio = fmt_ratio(v, peer.get(key), higher) if ok_peer and peer is not None else ""
            return f"{v:.2f}" + (f" ({ratio})" if ratio else "")

        bound = r["triad"] * 1e9 / r["bytes"] if r.get("bytes") else 0.0
        streams = [cell(f"streams_{n}") + (f" P={e[f'slots_{n}']}" if f"slots_{n}" in e else "") for n in self.counts]
        share = f"{e['decode'] / bound:.0%}" if bound and e.get("decode") else ""
        decode, prefill = cell("decode"), cell("prefill_s", False)
        if e.get("decode_rounds"):
            decode, share = rounds_cell(e, peer if ok_peer else None, "decode"), bound_share(r, e)
        if e.get("prefill_s_rounds"):
            prefill = rounds_cell(e, peer if ok_peer else None, "prefill_s", False)
        ours = eng == "ours"
        kv = f"{mb(e.get('kv_bytes', 0))} ({e.get('kv_tokens', 0)})" if ours else ""
        before = mb(e["rss_start"]) if "rss_start" in e else ""
        goal = f"{memory_goal(r, e) / MB:.0f}" if ours else ""
        return (f"| {r['file']} | {eng} | {r.get('file_bytes', 0) / MB:.0f} | {r.get('bytes', 0) / MB:.0f} | "
                f"{r['triad']:.1f} | {bound:.1f} | {decode} | {share} | " + " | ".join(streams) +
                f" | {prefill} | {kv} | {before} | {e.get('rss_load', 0) / MB:.0f} | "
                f"{e.get('rss_end', 0) / MB:.0f} | {goal} | {verdict(r, e) if ours else ''} |")

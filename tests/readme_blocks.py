"""The README's code blocks, as the snippet test runs them (tests/real/test_real_readme_snippets.py).

A block fenced with ```sh, ```bash or ```console runs in bash, one fenced with ```python in this interpreter,
each as written, in a folder laid out as a checkout after `make serve`. Every block runs unless ``SKIPPED``
names it (a prefix of its first line) with the reason, so a new snippet is tested by default; a block with
no language is refused by tests/unit/test_readme_snippets.py (it would hide a command from the test)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from tests.server_utils import ROOT

README = ROOT / "README.md"
RUNNERS = {"sh": "bash", "bash": "bash", "console": "bash", "python": "python"}
PORTS = (1025, 1026, 1027)  # the shipped config's business, management and metrics ports, as the snippets write them

# The blocks the test does not run: a prefix of the block's first line -> why.
SKIPPED = {
    "make serve   #": "the two make targets themselves: the test's server is started by the README's by-hand block, "
                     "the command `make serve` runs, and `make test` is the suite this test is part of",
    "lm_eval --model local-completions --tasks hellaswag": "hellaswag is a hub data set (nothing is downloaded here) "
                                                          "and the line is for a plain-HTTP server; "
                                                          "tests/integration/test_lm_eval.py runs local-completions "
                                                          "on a local task",
    "# node A (10.0.0.1)": "needs two hosts",
    ".venv/bin/python tools/bench_engine.py": "benchmarks give figures on a quiet machine, never in a test",
}
# The block that starts the server (the by-hand steps of `make serve`): the test runs it in the background.
START = "serve --config conf/config.json --prepare"


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    code: str

    @property
    def first(self) -> str:
        return self.code.splitlines()[0] if self.code else ""

    @property
    def skip_reason(self) -> str | None:
        return next((why for prefix, why in SKIPPED.items() if self.first.startswith(prefix)), None)

    @property
    def talks_to_server(self) -> bool:
        return any(f":{p}" in self.code for p in PORTS)

    @property
    def stops_server(self) -> bool:
        return "/stopService" in self.code

    def script(self, ports: tuple[int, int, int]) -> str:
        """The code as written, the shipped ports moved to ``ports``; a console block's ``$ `` commands only."""
        code = self.code
        if self.lang == "console":
            code = "\n".join(ln[2:] for ln in code.splitlines() if ln.startswith("$ "))
        for old, new in zip(PORTS, ports):
            code = code.replace(f":{old}", f":{new}")
        return code


def blocks(text: str | None = None) -> list[Block]:
    """Every fenced block of the README, in order (a block's language: its fence's word, "" when none)."""
    text = README.read_text() if text is None else text
    out = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.M | re.S):
        out.append(Block(text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2)))
    return out


def runnable(bs: list[Block]) -> list[Block]:
    """The snippets to run, in the order the test runs them: those that talk to the server, then those that stop
    it, then those that need none (the offline API: it loads the model in a process of its own)."""
    snippets = [b for b in bs if b.lang in RUNNERS and START not in b.code]
    return ([b for b in snippets if b.talks_to_server and not b.stops_server]
            + [b for b in snippets if b.stops_server] + [b for b in snippets if not b.talks_to_server])

"""``LLM(model=...)`` shows its load's progress to a Python user who configured no logging, as vLLM does: the
project's loggers print INFO lines to stderr through their own handler; the root logger is left alone, and
MINDIE_CONFIGURE_LOGGING=0 turns it off (issue 43: a 55 s load printed nothing)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import logging, sys
from mindie_service import LLM
LLM(model=sys.argv[1])
assert logging.getLogger().handlers == [], logging.getLogger().handlers
print("ROOT_UNTOUCHED")
"""


def _load(model: Path, **env: str) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", **env)
    return subprocess.run([sys.executable, "-c", SCRIPT, str(model)], capture_output=True, text=True, env=full,
                          timeout=300, cwd=ROOT)


def test_a_python_user_sees_the_load_steps(tiny_model: Path) -> None:
    r = _load(tiny_model)
    assert r.returncode == 0 and "ROOT_UNTOUCHED" in r.stdout, r.stderr
    for step in ("INFO mindie_service.llm: LLM: loading", "INFO mindie_service.models.loader: loaded",
                 "INFO mindie_service.engine.runner.engine_parts: KV pool:", "LLM: " + str(tiny_model) + " ready in"):
        assert step in r.stderr, (step, r.stderr)


def test_mindie_configure_logging_0_leaves_logging_alone(tiny_model: Path) -> None:
    r = _load(tiny_model, MINDIE_CONFIGURE_LOGGING="0")
    assert r.returncode == 0 and "ROOT_UNTOUCHED" in r.stdout, r.stderr
    assert "LLM: loading" not in r.stderr and "KV pool" not in r.stderr, r.stderr

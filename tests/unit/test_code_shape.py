"""The house rules a reader relies on (docs/design.md, Conventions): no file over 400 lines, no function
over 60, and module names unique across packages, in the three packages we ship."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("mindie_service", "multimodal", "npu_ops")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_no_file_over_400_lines() -> None:
    long = [f"{p.relative_to(ROOT)}: {n}" for p in _sources() if (n := p.read_text().count("\n")) > MAX_FILE_LINES]
    assert not long, f"files over {MAX_FILE_LINES} lines: {long}"


def test_no_function_over_60_lines() -> None:
    long = []
    for p in _sources():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_module_names_unique_across_packages() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for p in _sources():
        if p.name != "__init__.py":
            where[p.name].append(str(p.parent.relative_to(ROOT)))
    repeated = {name: dirs for name, dirs in where.items() if len(dirs) > 1}
    assert not repeated, f"module names repeated across packages: {repeated}"

"""tools/mutations.toml stays a table of bugs that can be planted: each row's old text occurs exactly once in its
file (a row whose code moved plants nothing and reads "error", which nobody sees until mutate.py runs; nine such
rows had piled up), its new text differs, its ids are unique and its tests' files exist. Static: no row is run."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from mutate import TABLE, load_table  # noqa: E402


def test_every_row_plants_its_bug_and_names_real_tests():
    rows = load_table(TABLE)
    ids = [m.id for m in rows]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    stale = []
    for m in rows:
        path = ROOT / m.file
        count = path.read_text(encoding="utf-8").count(m.old) if path.is_file() else -1
        if count != 1 or m.old == m.new:
            stale.append(f"{m.id}: {m.file} holds its old text {count} times")
        stale += [f"{m.id}: no test file {t}" for t in m.tests if not (ROOT / t.split("::")[0]).exists()]
    assert not stale, "\n".join(stale)

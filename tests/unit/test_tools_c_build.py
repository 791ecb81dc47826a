"""The C harnesses under tools/ (kernel A/Bs, the bandwidth-ceiling harness, the triad) call the kernels' entry points
and internal headers directly, and nothing else builds them: a kernel whose signature changes would leave them broken
until the next benchmark (tools/ab_ceiling.c was, by one argument of gguf_linear_team). Each must still compile
against the tree's headers. Syntax and types only (-fsyntax-only: no link, no run), with AVX2 / FMA / F16C asked for
explicitly so the check does not depend on the machine's CPU."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESSES = sorted((ROOT / "tools").glob("*.c"))
FLAGS = ["-fsyntax-only", "-std=gnu11", "-fopenmp", "-mavx2", "-mfma", "-mf16c",
         "-Werror=implicit-function-declaration", "-Werror=int-conversion", "-Werror=incompatible-pointer-types",
         f"-I{ROOT / 'npu_ops' / 'csrc'}"]


def test_there_are_harnesses_to_check():
    assert {p.name for p in HARNESSES} >= {"ab_ceiling.c", "ab_q5.c", "membw.c"}


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc here")
@pytest.mark.parametrize("harness", HARNESSES, ids=lambda p: p.name)
def test_each_c_harness_compiles_against_the_trees_kernels(harness):
    proc = subprocess.run(["gcc", *FLAGS, str(harness)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]

"""tools/device_check.py runs as prepared: its dry run (every section on the CPU at tiny sizes, the Triton kernels
in Triton's interpreter) prints each section, and the kernels agree with the reference there."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_device_check_dry_runs_every_section_on_the_cpu(tiny_model, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "device_check.py"), "--dry-run", "--demo",
                          str(tiny_model), "--work", str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    for title in ("2. Triton kernels vs the reference path", "3. copy bandwidth", "4. greedy parity",
                  "5. decode throughput", "device check done"):
        assert title in out, out
    diffs = [float(x) for x in re.findall(r"max\|diff\| (\S+)", out)]
    assert len(diffs) == 7 and max(diffs) < 1e-4, out  # fp32 in the dry run: each kernel as the reference
    assert "demo model: 2/2 outputs identical" in out
    for graphs in ("on ", "off"):
        assert len(re.findall(rf"graphs {graphs}\s+2 streams: decode step", out)) == 1, out

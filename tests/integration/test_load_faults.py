"""tools/load_faults.py at small scale: streaming clients on keep-alive connections, a third of them going
away at a seeded random moment (some before the first token); afterwards nothing is left running, no KV
block is held, the greedy probes give the same text, and the server logged no error. (The memory figure
belongs to the full-scale run: at this scale the process has not settled.)"""
from __future__ import annotations

import json
import subprocess
import sys

from tests.server_utils import ROOT


def test_disconnecting_streaming_clients_leak_nothing(tiny_model):
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "load_faults.py"), "--model", str(tiny_model),
                           "--requests", "60", "--clients", "8", "--warmup", "16", "--seed", "7", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["requests"] == 60 and r["disconnected"] >= 10 and r["disconnected_before_first_token"] >= 1
    assert r["disconnects_logged"] >= 1  # the server saw clients go away mid-request
    assert r["failed"] == 0 and r["disconnect_errors"] == 0, r["first_failure"]
    assert r["completed"] == 60 - r["disconnected"]
    assert (r["running"], r["waiting"], r["in_flight"]) == (0, 0, 0)
    assert r["blocks_free"] == r["blocks_total"]
    assert r["probes_unchanged"] and all(not t.startswith("HTTP") for t in r["probes_before"])
    assert r["bad_log_lines"] == []
    assert proc.returncode == 0, r["checks"]

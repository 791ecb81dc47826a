"""The DEBUG phase line of a sequence (serving.streams.phase_line) and tools/bench_priority.py --phases, which
reads it back from the server log: the two stay in step."""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from mindie_service.serving.observer import SequenceRecord
from mindie_service.serving.streams import phase_line

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_priority", ROOT / "tools" / "bench_priority.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rec(i: int, t0: float, first: float | None) -> SequenceRecord:
    return SequenceRecord(request_id=f"q{i}", model="m", prompt_tokens=4, generated=1, cached_tokens=0,
                          finish_reason="length", t0=t0, end=t0 + 1, first=first,
                          queued_at=t0 + 0.010, scheduled_at=t0 + 0.011)


def test_phase_line_reads_back_as_the_bench_medians(tmp_path: Path) -> None:
    rec = _rec(0, 100.0, 100.025)
    line = phase_line(rec, -10, {"admitted": 100.002, "ready": 100.004})
    assert line == "phases q0 rank=-10 admitted=2.00 ready=4.00 queued=10.00 scheduled=11.00 first=25.00"
    assert phase_line(_rec(1, 5.0, None), 0, {}).endswith("admitted=- ready=- queued=10.00 scheduled=11.00 first=-")
    # 2 warm-up, 2 idle, 2 loaded urgent probes (rank -10), a load request (rank 10) between them
    lines = [phase_line(_rec(i, 0.0, 0.001 * (i + 20)), -10, {"admitted": 0.001, "ready": 0.002}) for i in range(6)]
    lines.insert(4, phase_line(_rec(9, 0.0, 0.5), 10, {}))
    log = tmp_path / "server.log"
    log.write_text("".join(f"2026-01-01 00:00:00,000 DEBUG mindie_service.serving.streams: {x}\n" for x in lines))
    got = _bench().phases(log, argparse.Namespace(route="openai", probes=2))
    assert got["idle"]["first"] == 22.5 and got["loaded"]["first"] == 24.5 and got["loaded"]["queued"] == 10.0

"""SIGTERM drains: the listeners close, the request in flight runs to its end, the process exits 0."""
from __future__ import annotations

import json
import time

import requests

from tests.server_utils import ServerProcess, write_config


def test_sigterm_finishes_running_requests_then_exits_0(tiny_model, tmp_path):
    cfg = write_config(tmp_path / "config.json", tiny_model, schedule={"maxIterTimes": 400})
    srv = ServerProcess(cfg, tmp_path / "server.log").start().wait_ready()
    try:
        r = requests.post(srv.url() + "/", json={"inputs": "The quiet market", "stream": True,
                                                 "parameters": {"max_new_tokens": 300, "details": True}},
                          stream=True, timeout=60)
        lines = r.iter_lines()
        next(line for line in lines if line.startswith(b"data:"))  # under way
        srv.proc.send_signal(15)
        frames = [json.loads(line[5:]) for line in lines if line.startswith(b"data:")]
        last = frames[-1]
        assert "error" not in last and last["generated_text"] is not None, last
        assert last["details"]["generated_tokens"] == len(frames) + 1
        assert srv.proc.wait(30) == 0, srv.log()
        log = srv.log()
        assert "draining: 1 request(s) in flight" in log and "stopped" in log
        t0 = time.monotonic()
        try:
            requests.get(srv.url("management") + "/health", timeout=2)
            raise AssertionError("still listening")
        except requests.ConnectionError:
            assert time.monotonic() - t0 < 2
    finally:
        srv.stop()

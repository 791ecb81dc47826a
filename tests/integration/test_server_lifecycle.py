"""SIGTERM and POST /stopService drain: the listeners close at once (a new connection is refused) while the
request in flight runs to its end, then the process exits 0. A second SIGINT during the drain stops at once:
the stream in flight ends with an error frame and the process exits 4."""
from __future__ import annotations

import json
import socket

import pytest
import requests

from tests.server_utils import ServerProcess, launch, wait_until, write_config

LONG = {"max_new_tokens": 600, "details": True}  # a stream that outlives the start of the drain by far


def _server(tiny_model, tmp_path) -> ServerProcess:
    return launch(lambda: ServerProcess(write_config(tmp_path / "config.json", tiny_model,
                                                     deploy={"maxSeqLen": 1024, "maxInputTokenLen": 256},
                                                     schedule={"maxIterTimes": 700}),
                                        tmp_path / "server.log"))


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        return False
    except ConnectionRefusedError:
        return True


def _open_stream(srv: ServerProcess):
    r = requests.post(srv.url() + "/", json={"inputs": "The quiet market", "stream": True, "parameters": LONG},
                      stream=True, timeout=60)
    assert r.status_code == 200, r.text
    lines = r.iter_lines()
    first = next(line for line in lines if line.startswith(b"data:"))  # under way
    return [json.loads(first[5:])], lines


def _drain_while_streaming(srv: ServerProcess, frames: list, lines) -> None:
    """New connections are refused on every plane while the stream keeps coming, and it ends cleanly."""
    ports = [srv.cfg["port"], srv.cfg["managementPort"], srv.cfg["metricsPort"]]
    assert wait_until(lambda: all(_refused(p) for p in ports), timeout=30), "listeners still open while draining"
    # Refused while the process still runs: it is draining the stream (which needs seconds more), not gone.
    assert srv.proc.poll() is None and "stopped" not in srv.log(), srv.log()
    before = len(frames)
    frames.extend(json.loads(line[5:]) for line in lines if line.startswith(b"data:"))
    assert len(frames) > before  # the stream went on after the listeners closed
    last = frames[-1]
    assert "error" not in last and last["generated_text"] is not None, last
    assert last["details"]["generated_tokens"] == len(frames) == LONG["max_new_tokens"]
    assert srv.proc.wait(60) == 0, srv.log()


def test_sigterm_finishes_running_requests_then_exits_0(tiny_model, tmp_path):
    srv = _server(tiny_model, tmp_path)
    try:
        frames, lines = _open_stream(srv)
        srv.proc.send_signal(15)
        _drain_while_streaming(srv, frames, lines)
        log = srv.log()
        assert "draining 1 request(s), up to " in log and "stopped" in log
        with pytest.raises(requests.ConnectionError):
            requests.get(srv.url("management") + "/health", timeout=5)
    finally:
        srv.stop()


def test_stop_service_on_the_management_port_drains_and_exits_0(tiny_model, tmp_path):
    srv = _server(tiny_model, tmp_path)
    try:
        assert srv.post("/stopService", {}).status_code == 403  # the business port does not serve it
        frames, lines = _open_stream(srv)
        r = srv.post("/stopService", {}, plane="management")
        assert r.status_code == 200 and r.json() == {"status": "stopping"}
        _drain_while_streaming(srv, frames, lines)
        log = srv.log()
        assert "stopService received" in log and "draining 1 request(s), up to " in log
    finally:
        srv.stop()


def test_a_second_sigint_during_the_drain_stops_at_once(tiny_model, tmp_path):
    srv = _server(tiny_model, tmp_path)
    try:
        frames, lines = _open_stream(srv)
        srv.proc.send_signal(2)
        assert wait_until(lambda: "Ctrl-C again to stop now" in srv.log(), timeout=30), srv.log()
        assert "draining 1 request(s), up to 60 s; Ctrl-C again to stop now" in srv.log()
        srv.proc.send_signal(2)
        rest = [json.loads(line[5:]) for line in lines if line.startswith(b"data:")]
        assert rest and "stopped at once" in rest[-1].get("error", ""), rest[-1:]
        assert len(frames) + len(rest) - 1 < LONG["max_new_tokens"]  # cut short, not drained
        assert srv.proc.wait(30) == 4, srv.log()
        assert "SIGINT received again: stopping now" in srv.log()
    finally:
        srv.stop()

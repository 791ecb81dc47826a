"""Killing the server (SIGKILL) while a request's load of a catalog model is under way, then starting it again,
leaves the catalog consistent (issue 46): no model reads ``starting``, the models folder holds exactly the files it
held before (no partial file), and the next request naming the model loads it."""
from __future__ import annotations

import os
import shutil
import signal
import threading
from pathlib import Path

import pytest
import requests

from tests.server_utils import ServerProcess, wait_until, write_config

pytestmark = pytest.mark.slow


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_kill_during_a_load_then_restart(tiny_model, tmp_path, monkeypatch):
    models = tmp_path / "models"
    models.mkdir()
    shutil.copytree(tiny_model, models / "tiny2")
    cfg = write_config(tmp_path / "config.json", tiny_model, deploy={"modelsDir": str(models)},
                       schedule={"numKvBlocks": 64})
    before = _files(models)
    monkeypatch.setenv("MINDIE_SERVICE_FAULTS", "slow_load=5")  # every engine build waits 5 s first
    srv = ServerProcess(cfg, tmp_path / "server.log").start()
    try:
        srv.wait_ready(loading_timeout=240)
        monkeypatch.delenv("MINDIE_SERVICE_FAULTS")
        body = {"model": "tiny2", "prompt": "River", "max_tokens": 2}
        threading.Thread(target=lambda: _quiet_post(srv, body), daemon=True).start()
        assert wait_until(lambda: srv.get("/v1/models/tiny2").json()["state"] == "starting", timeout=60), srv.log()
        os.kill(srv.proc.pid, signal.SIGKILL)  # mid-load
        srv.proc.wait(timeout=30)
    finally:
        if srv.proc.poll() is None:
            srv.stop()
    assert _files(models) == before  # nothing partial, nothing new
    again = ServerProcess(cfg, tmp_path / "server2.log").start().wait_ready()
    try:
        listed = {m["id"]: m for m in again.get("/v1/models").json()["data"]}
        assert all(m["status"] != "starting" for m in listed.values()), listed
        assert listed["tiny2"]["status"] == "downloaded"
        r = again.post("/v1/completions", body)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
        assert again.get("/v1/models/tiny2").json()["status"] == "running"
        assert _files(models) == before
    finally:
        again.stop()


def _quiet_post(srv: ServerProcess, body: dict) -> None:
    try:
        srv.post("/v1/completions", body)
    except requests.RequestException:
        pass  # the server was killed under it

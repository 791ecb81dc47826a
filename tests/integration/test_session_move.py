"""A kept /api/* session moves between two servers over the management port (GET / PUT /v1/sessions/{id}) and
its continuation there equals an uninterrupted greedy generation; a drained server leaves it on disk."""
from __future__ import annotations

import requests

from tests.server_utils import ServerProcess, write_config

PROMPT = "The river runs past the old mill and the stone bridge, where the miller keeps his"


def _server(tmp, tiny_model, name: str) -> ServerProcess:
    (tmp / name).mkdir()
    cfg = write_config(tmp / name / "config.json", tiny_model, schedule={"sessionSpillDir": "sessions"})
    return ServerProcess(cfg, tmp / name / "server.log").start()


def _one(srv: ServerProcess, rid: str, n: int, prompt: str = PROMPT) -> str:
    r = srv.post("/api/generate-one", {"request_id": rid, "prompt": prompt, "stream_response": False,
                                       "generation_config": {"do_sample": False, "max_new_tokens": n}})
    assert r.status_code == 200, r.text
    return r.text


def test_a_session_moves_between_two_servers_and_continues_identically(tmp_path, tiny_model):
    a, b = _server(tmp_path, tiny_model, "a"), _server(tmp_path, tiny_model, "b")
    try:
        a.wait_ready(120)
        b.wait_ready(120)
        whole = _one(b, "whole", 30)  # uninterrupted, on the server the session moves to
        first = _one(a, "s1", 12)
        exported = a.get("/v1/sessions/s1", "management")
        assert exported.status_code == 200 and exported.headers["Content-Type"] == "application/octet-stream"
        assert a.get("/v1/sessions/nobody", "management").status_code == 404
        wrong = requests.put(b.url("management") + "/v1/sessions/other", data=exported.content, timeout=30)
        assert wrong.status_code == 422  # the file names another request_id
        damaged = bytearray(exported.content)
        damaged[20] ^= 0xFF
        assert requests.put(b.url("management") + "/v1/sessions/s1", data=bytes(damaged), timeout=30).status_code == 422
        r = requests.put(b.url("management") + "/v1/sessions/s1", data=exported.content, timeout=30)
        assert r.status_code == 200 and r.json()["kv"] is True and r.json()["adopted"] is True, r.text
        second = _one(b, "s1", 18, prompt="ignored")
        assert first + second == whole
        assert b.status()["instances"][0]["sessionHits"] == 1
        a.stop()  # the drain writes a's kept session to its folder
        assert list((tmp_path / "a" / "sessions").glob("*.session"))
    finally:
        a.stop()
        b.stop()

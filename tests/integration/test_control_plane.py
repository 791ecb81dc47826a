"""The control plane (issue 28): what changes what is served lives on the management port (the business port
answers 403 naming it); API keys per plane (config lists and a hashed key file, reloaded on SIGHUP), 401 in
each dialect with WWW-Authenticate, the probes open; a catalog entry sharing a configured model's folder is not
deleted; a default model that failed to start says so (/health, /v1/status, /info, Jan's routes) and starts
again once the cause is gone."""
from __future__ import annotations

import hashlib
import shutil
import signal
from pathlib import Path

import pytest
import requests

from tests.server_utils import ServerProcess, wait_until, write_config

pytestmark = pytest.mark.slow

BIZ, ADMIN, FILE_KEY, LATER_KEY = "biz-key-0123456789", "admin-key-0123456789", "file-key-abcdefgh", "later-key-zz9"
MUTATING = [("put", "/v1/models/x/start"), ("put", "/v1/models/x/stop"), ("delete", "/v1/models/x"),
            ("get", "/v1/models/download/x"), ("post", "/stopService"), ("post", "/v1/load_lora_adapter"),
            ("post", "/v1/unload_lora_adapter")]


def _call(srv: ServerProcess, method: str, path: str, plane: str = "business", key: str | None = None,
          **kw) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if method in ("post", "put"):
        kw.setdefault("json", {})
    return requests.request(method, srv.url(plane) + path, headers=headers, timeout=30, **kw)


@pytest.fixture(scope="module")
def open_srv(tmp_path_factory, tiny_model):
    tmp = tmp_path_factory.mktemp("planes")
    (tmp / "models").mkdir()
    cfg = write_config(tmp / "config.json", tiny_model, deploy={
        "modelsDir": str(tmp / "models"),
        "ModelConfig": [{"modelName": "x", "modelWeightPath": str(tiny_model), "modelInstanceType": "StandardMock"}]})
    s = ServerProcess(cfg, tmp / "server.log").start().wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def key_srv(tmp_path_factory, tiny_model):
    tmp = tmp_path_factory.mktemp("keys")
    models = tmp / "models"
    shutil.copytree(tiny_model, models / "tiny")
    keys = tmp / "keys.txt"
    keys.write_text(f"# hashed keys\nbusiness sha256:{hashlib.sha256(FILE_KEY.encode()).hexdigest()}\n")
    cfg = write_config(tmp / "config.json", models / "tiny", model_name="demo-tiny", server={
        "businessApiKeys": [BIZ], "managementApiKeys": [ADMIN], "apiKeyFile": str(keys),
        "managementRoutesOnBusinessPort": True}, deploy={"modelsDir": str(models)})
    s = ServerProcess(cfg, tmp / "server.log").start().wait_ready()  # (/health needs no key)
    s.keys, s.models = keys, models
    yield s
    s.stop()


def test_the_business_port_refuses_what_changes_what_is_served(open_srv):
    port = str(open_srv.cfg["managementPort"])
    for method, path in MUTATING:
        r = _call(open_srv, method, path)
        assert r.status_code == 403, (method, path, r.text)
        body = r.json()
        message = body["error"]["message"] if isinstance(body["error"], dict) else body["error"]
        assert "management port" in message and port in message, message
        assert isinstance(body["error"], dict) == path.startswith("/v1/models")  # each route's dialect
    assert _call(open_srv, "get", "/v1/models").status_code == 200
    assert _call(open_srv, "get", "/v1/models/x").json()["state"] == "running"
    assert _call(open_srv, "put", "/v1/models/x/stop", "management").status_code == 200  # served there
    assert wait_until(lambda: _call(open_srv, "get", "/v1/models/x").json()["state"] == "stopped")
    assert _call(open_srv, "put", "/v1/models/x/start", "management").status_code == 200
    assert wait_until(lambda: _call(open_srv, "get", "/v1/models/x").json()["state"] == "running")


def test_each_port_documents_what_it_serves(open_srv):
    biz = _call(open_srv, "get", "/openapi.json").json()["paths"]
    mgmt = _call(open_srv, "get", "/openapi.json", "management").json()["paths"]
    assert set(biz["/v1/models/{id}"]) == {"get"} and "/stopService" not in biz and "/v1/models/{id}/start" not in biz
    assert set(mgmt["/v1/models/{id}"]) == {"get", "delete"} and "post" in mgmt["/stopService"]
    assert "/v1/load_lora_adapter" in mgmt and "/v1/completions" not in mgmt


def test_api_keys_per_plane_in_each_dialect(key_srv):
    for path, body in (("/", {"inputs": "River", "parameters": {"max_new_tokens": 2}}),
                       ("/v1/completions", {"model": "demo-tiny", "prompt": "River", "max_tokens": 2})):
        r = _call(key_srv, "post", path, json=body)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
        err = r.json()["error"]
        assert (err["code"] == "unauthorized") if path != "/" else (r.json()["error_type"] == "unauthorized")
        assert _call(key_srv, "post", path, key="wrong-key-000000", json=body).status_code == 401
        assert _call(key_srv, "post", path, key=ADMIN, json=body).status_code == 401  # not a business key
        assert _call(key_srv, "post", path, key=BIZ, json=body).status_code == 200
        assert _call(key_srv, "post", path, key=FILE_KEY, json=body).status_code == 200  # from apiKeyFile
    for plane, path in (("business", "/health"), ("management", "/health"), ("management", "/v2/health/live"),
                        ("management", "/v2/health/ready")):
        assert _call(key_srv, "get", path, plane).status_code == 200, (plane, path)  # probes stay open
    assert _call(key_srv, "get", "/v1/status", "management").status_code == 401
    assert _call(key_srv, "get", "/v1/status", "management", key=BIZ).status_code == 401
    assert _call(key_srv, "get", "/v1/status", "management", key=ADMIN).status_code == 200
    # managementRoutesOnBusinessPort: served on the business port, with the admin key only
    assert _call(key_srv, "put", "/v1/models/nope/stop", key=BIZ).status_code == 401
    assert _call(key_srv, "put", "/v1/models/nope/stop", key=ADMIN).status_code == 404
    assert _call(key_srv, "get", "/v1/models/demo-tiny", key=BIZ).status_code == 200
    # SIGHUP re-reads the key file
    assert _call(key_srv, "get", "/v1/models", key=LATER_KEY).status_code == 401
    key_srv.keys.write_text(f"business sha256:{hashlib.sha256(LATER_KEY.encode()).hexdigest()}\n")
    key_srv.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: _call(key_srv, "get", "/v1/models", key=LATER_KEY).status_code == 200)
    assert _call(key_srv, "get", "/v1/models", key=FILE_KEY).status_code == 401  # gone from the file
    assert _call(key_srv, "get", "/v1/models", key=BIZ).status_code == 200  # config.json's stay
    log = key_srv.log()
    assert not any(k in log for k in (BIZ, ADMIN, FILE_KEY, LATER_KEY)) and "API keys reloaded" in log


def test_a_configured_models_folder_is_never_deleted_and_a_failed_start_says_so(key_srv):
    m = key_srv.models / "tiny"
    r = _call(key_srv, "delete", "/v1/models/tiny", "management", key=ADMIN)
    assert r.status_code == 409 and "demo-tiny" in r.json()["error"]["message"], r.text
    assert (m / "model.safetensors").is_file()
    assert _call(key_srv, "put", "/v1/models/demo-tiny/stop", "management", key=ADMIN).status_code == 200
    state = lambda: _call(key_srv, "get", "/v1/models/demo-tiny", key=BIZ).json()  # noqa: E731
    assert wait_until(lambda: state()["state"] == "stopped", timeout=60)
    (m / "model.safetensors").rename(key_srv.models / "moved.bin")  # the cause
    try:
        assert _call(key_srv, "put", "/v1/models/demo-tiny/start", "management", key=ADMIN).status_code == 200
        assert wait_until(lambda: "load_error" in state(), timeout=60), key_srv.log()
        got = state()
        assert got["state"] == "stopped" and got["load_error"]  # the seed's enum; the error beside it
        listed = {e["id"]: e for e in _call(key_srv, "get", "/v1/models", key=BIZ).json()["data"]}
        assert listed["demo-tiny"]["state"] is None and listed["demo-tiny"]["load_error"]
        for plane, path in (("management", "/health"), ("management", "/v1/status"), ("business", "/info")):
            r = _call(key_srv, "get", path, plane, key=ADMIN if plane == "management" else BIZ)
            assert r.status_code == 503 and "failed to start" in r.json()["error"], (path, r.text)
    finally:
        (key_srv.models / "moved.bin").rename(m / "model.safetensors")
    assert _call(key_srv, "put", "/v1/models/demo-tiny/start", "management", key=ADMIN).status_code == 200
    assert wait_until(lambda: state()["state"] == "running", timeout=120), key_srv.log()
    st = _call(key_srv, "get", "/v1/status", "management", key=ADMIN).json()
    assert st["model"] == {"id": "demo-tiny", "state": "running", "error": None}
    assert _call(key_srv, "get", "/health", "management").status_code == 200

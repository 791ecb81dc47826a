"""Fuzzing holds (issue 28): schemathesis against each port's /openapi.json, every documented operation, first
without an API key (every answer 401/403 and nothing changes: catalog and files the same), then with the port's
key (no 5xx, every response inside the document). Afterwards the server is healthy, the default model answers,
and every file under modelsDir and of the configured weights is intact. Destructive operations reach only the
models the test made for them: the document's model id is narrowed to those (and an unknown one), and the
``model`` of a generation request to the default model (and an unknown one). The one
operation left out of the keyed run is POST /stopService (it would end the server); its refusal without a key
is in the keyless run. Deterministic (the same cases every run) and small (a few examples per operation)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.server_utils import ServerProcess, write_config

pytestmark = pytest.mark.slow

KEYS = {"business": "fuzz-biz-key-0001", "management": "fuzz-admin-key-0001", "metrics": "fuzz-metrics-key-01"}
CREATED = ("fuzz-ckpt", "fuzz-json")  # the models destructive operations may reach
HOOKS = Path(__file__).with_name("st_key_hooks.py")
EXAMPLES = "6"  # per operation; --generation-deterministic: the same cases every run


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model):
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    models = tmp / "models"
    # the configured model's weights, inside modelsDir (the set-up)
    shutil.copytree(tiny_model, models / "tiny")
    shutil.copytree(tiny_model, models / "fuzz-ckpt")
    (models / "fuzz-json").mkdir()
    for mid, src in (("fuzz-ckpt", "/nonexistent/fuzz.tar"), ("fuzz-json", "http://127.0.0.1:9/fuzz.tar")):
        (models / mid / "model.json").write_text(json.dumps({"id": mid, "source_url": src}))
    cfg = write_config(tmp / "config.json", models / "tiny", model_name="demo-tiny", server={
        f"{plane}ApiKeys": [key] for plane, key in KEYS.items()}, deploy={
        "modelsDir": str(models),
        "ModelConfig": [{"modelName": "demo-tiny", "modelWeightPath": str(models / "tiny"),
                         "modelInstanceType": "StandardMock"}]})
    s = ServerProcess(cfg, tmp / "server.log").start().wait_ready()
    s.models, s.tmp = models, tmp
    yield s
    s.stop()


def _hashes(root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    out = {}
    for f in sorted(root.rglob("*")):
        rel = f.relative_to(root)
        if f.is_file() and rel.parts[0] not in skip:
            out[str(rel)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def _document(srv: ServerProcess, plane: str, dest: Path) -> Path:
    """The port's own document, its path ``id`` narrowed to the test's models (and one that does not exist)."""
    doc = requests.get(srv.url(plane) + "/openapi.json", headers=_auth(plane), timeout=30).json()
    for ops in doc["paths"].values():
        for op in ops.values():
            for prm in op.get("parameters", []):
                if prm["name"] == "id":
                    prm["schema"] = {"enum": [*CREATED, "no-such-model"]}
                    prm.pop("examples", None)
    for schema in doc["components"]["schemas"].values():  # requests name the running model (a stopped one is a 503)
        if "model" in schema.get("properties", {}):
            schema["properties"]["model"] = {"enum": ["demo-tiny", "no-such-model"]}
    dest.write_text(json.dumps(doc))
    return dest


def _auth(plane: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[plane]}"}


def _st(srv: ServerProcess, plane: str, tmp: Path, *, key: bool) -> subprocess.CompletedProcess:
    checks = ("not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
              if key else "not_a_server_error,refused_without_a_key")
    cmd = [str(Path(sys.executable).parent / "st"), "run", str(_document(srv, plane, tmp / f"{plane}.json")),
           "--url", srv.url(plane), "--max-examples", EXAMPLES, "--generation-deterministic",
           "--phases", "examples,coverage,fuzzing", "-c", checks, "--workers", "1", "--suppress-health-check", "all",
           "--generation-with-security-parameters", "false", "--no-color", "--request-timeout", "30"]
    if key:
        cmd += ["-H", f"Authorization: Bearer {KEYS[plane]}", "--exclude-path", "/stopService"]
    env = dict(os.environ, SCHEMATHESIS_HOOKS=str(HOOKS))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    (tmp / f"st-{plane}-{'key' if key else 'nokey'}.txt").write_text(r.stdout + r.stderr)
    print(r.stdout[-1500:])
    return r


def _catalog(srv: ServerProcess) -> list[tuple[str, str]]:
    data = requests.get(srv.url("management") + "/v1/models", headers=_auth("management"), timeout=30).json()["data"]
    return sorted((m["id"], str(m.get("state"))) for m in data)


def _intact(srv: ServerProcess, weights: dict[str, str]) -> None:
    for plane in ("business", "management"):
        assert requests.get(srv.url(plane) + "/health", timeout=10).status_code == 200, srv.log()[-3000:]
    r = requests.post(srv.url() + "/", json={"inputs": "River", "parameters": {"max_new_tokens": 2}},
                      headers=_auth("business"), timeout=30)
    assert r.status_code == 200, r.text
    assert _hashes(srv.models, skip=CREATED) == weights


@pytest.mark.parametrize("plane", ["business", "management", "metrics"])
def test_without_a_key_every_operation_is_refused_and_nothing_changes(server, tmp_path, plane):
    files, catalog = _hashes(server.models), _catalog(server)
    r = _st(server, plane, tmp_path, key=False)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert _hashes(server.models) == files and _catalog(server) == catalog
    _intact(server, _hashes(server.models, skip=CREATED))


@pytest.mark.parametrize("plane", ["metrics", "business", "management"])
def test_with_the_key_no_5xx_and_everything_inside_the_document(server, tmp_path, plane):
    weights = _hashes(server.models, skip=CREATED)
    r = _st(server, plane, tmp_path, key=True)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    _intact(server, weights)

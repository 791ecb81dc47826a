"""The model catalog over HTTP: two demo models (the ModelConfig one and a folder in modelsDir), list, start
the second, generate with each by name, stop it, delete it; a model that won't fit, unknown ids, a running
model's delete: each a clear error, nothing left behind, the server healthy."""
from __future__ import annotations

import functools
import http.server
import io
import json
import shutil
import struct
import tarfile
import threading
from pathlib import Path

import pytest
import requests

from tests.server_utils import ServerProcess, wait_until, write_config

pytestmark = pytest.mark.slow


def _huge(folder: Path) -> None:
    """A checkpoint whose safetensors header claims 10^13 float32 values (no data: only the header is read)."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2,
                                                    "hidden_size": 64, "num_attention_heads": 4,
                                                    "vocab_size": 100, "torch_dtype": "float32"}))
    header = json.dumps({"w": {"dtype": "F32", "shape": [10_000_000, 1_000_000], "data_offsets": [0, 0]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)


@pytest.fixture(scope="module")
def srv(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("catalog")
    models = tmp / "models"
    models.mkdir()
    shutil.copytree(tiny_model, models / "tiny2")
    (models / "tiny2" / "model.json").write_text(json.dumps({
        "id": "tiny2", "name": "Tiny two", "source_url": "/etc/passwd", "parameters": {"temperature": "0"},
        "engine_parameters": {"ctx_len": 256}}))
    _huge(models / "huge")
    cfg = write_config(tmp / "config.json", tiny_model, deploy={"modelsDir": str(models)})
    s = ServerProcess(cfg, tmp / "server.log").start().wait_ready()
    s.models = models
    yield s
    s.stop()


def _put(srv: ServerProcess, path: str) -> requests.Response:
    return requests.put(srv.url("management") + path, timeout=30)


def _delete(srv: ServerProcess, path: str) -> requests.Response:
    return requests.delete(srv.url("management") + path, timeout=30)


def _state(srv: ServerProcess, mid: str) -> str:
    return srv.get(f"/v1/models/{mid}").json()["state"]


def _complete(srv: ServerProcess, model: str) -> tuple[int, dict]:
    r = srv.post("/v1/completions", {"model": model, "prompt": "River mountain", "max_tokens": 4})
    return r.status_code, r.json()


def test_catalog_lifecycle(srv):
    listed = {m["id"]: m for m in srv.get("/v1/models").json()["data"]}
    assert listed["tiny"]["state"] == "running" and listed["tiny2"]["state"] is None
    assert listed["tiny2"]["source_url"] == "local:tiny2"  # never a server path
    got = srv.get("/v1/models/tiny2").json()
    assert got["state"] == "stopped" or got["state"] == "downloaded"
    assert got["engine_parameters"]["ctx_len"] == 256

    code, body = _complete(srv, "tiny2")  # a stopped model is loaded by the request naming it (issue 46)
    assert code == 200 and body["model"] == "tiny2", body
    assert _state(srv, "tiny2") == "running"
    r = _put(srv, "/v1/models/tiny2/start")
    assert r.status_code == 200 and r.json()["state"] == "running"
    for model in ("tiny", "tiny2"):
        code, body = _complete(srv, model)
        assert code == 200 and body["model"] == model and body["usage"]["completion_tokens"] == 4
    # model.json's temperature "0" is tiny2's default: greedy, so two calls agree
    assert _complete(srv, "tiny2")[1]["choices"][0]["text"] == _complete(srv, "tiny2")[1]["choices"][0]["text"]

    r = _delete(srv, "/v1/models/tiny2")
    assert r.status_code == 409 and r.json()["error"]["code"] == "conflict"
    r = _put(srv, "/v1/models/tiny2/stop")
    assert r.status_code == 200
    assert wait_until(lambda: _state(srv, "tiny2") == "stopped", timeout=60)
    r = _delete(srv, "/v1/models/tiny2")
    assert r.status_code == 200 and r.json() == {"id": "tiny2", "object": "model", "deleted": True}
    assert not (srv.models / "tiny2").exists() and (srv.models / "huge").exists()
    assert srv.get("/v1/models/tiny2").status_code == 404
    assert srv.post("/", {"inputs": "River", "parameters": {"max_new_tokens": 2}}).status_code == 200


def test_bad_requests_are_clear_and_leave_the_server_healthy(srv):
    r = _put(srv, "/v1/models/huge/start")
    assert r.status_code == 409 and "does not fit" in r.json()["error"]["message"]
    assert _state(srv, "huge") in ("downloaded", "stopped")
    r = srv.get("/v1/models/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert _put(srv, "/v1/models/nope/start").status_code == 404
    r = _delete(srv, "/v1/models/tiny")
    assert r.status_code == 409  # a running model (and a config.json entry)
    assert srv.get("/v1/models/..%2f..%2fetc").status_code in (400, 404)
    assert srv.get("/health", "management").status_code == 200


def test_download_from_a_private_address_is_refused_at_once(srv):
    (srv.models / "priv").mkdir()
    (srv.models / "priv" / "model.json").write_text(json.dumps({"source_url": "http://127.0.0.1:9/m.tar.gz"}))
    r = srv.get("/v1/models/download/priv", "management")
    assert r.status_code == 403 and "127.0.0.1" in r.json()["error"]["message"]
    got = srv.get("/v1/models/priv").json()
    assert got["state"] == "not_downloaded" and sorted(p.name for p in (srv.models / "priv").iterdir()) == ["model.json"]
    assert not any(p.name.startswith(".") for p in srv.models.iterdir())  # no staging left


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def dl_srv(tiny_model, tmp_path_factory):
    """A server that may fetch from loopback (allowPrivateMediaUrls), and a local HTTP server of archives."""
    tmp = tmp_path_factory.mktemp("download")
    files = tmp / "files"
    files.mkdir()
    with tarfile.open(files / "tiny.tar.gz", "w:gz") as t:
        t.add(tiny_model, arcname="tiny")
    with tarfile.open(files / "evil.tar.gz", "w:gz") as t:
        data = b"x"
        info = tarfile.TarInfo("../escaped.txt")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(files)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    models = tmp / "models"
    for mid, name in (("fetched", "tiny.tar.gz"), ("evil", "evil.tar.gz"), ("missing", "nope.tar.gz")):
        (models / mid).mkdir(parents=True)
        (models / mid / "model.json").write_text(json.dumps({"source_url": f"{base}/{name}",
                                                             "name": mid, "parameters": {"temperature": "0"}}))
    cfg = write_config(tmp / "config.json", tiny_model, server={"allowPrivateMediaUrls": True}, deploy={
        "modelsDir": str(models), "ModelConfig": [{"modelName": "mock", "modelWeightPath": str(tiny_model),
                                                   "modelInstanceType": "StandardMock"}]})
    s = ServerProcess(cfg, tmp / "server.log").start().wait_ready()
    s.models, s.tmp = models, tmp
    yield s
    s.stop()
    httpd.shutdown()


def test_download_a_model_over_http_then_start_it(dl_srv):
    r = dl_srv.get("/v1/models/download/fetched", "management")
    assert r.status_code == 200 and "message" in r.json()
    assert wait_until(lambda: _state(dl_srv, "fetched") == "downloaded", timeout=60), dl_srv.log()
    got = dl_srv.get("/v1/models/fetched").json()
    assert got["metadata"]["download"]["bytes_done"] == got["metadata"]["download"]["bytes_total"] > 0
    folder = dl_srv.models / "fetched"
    assert (folder / "config.json").is_file() and (folder / "model.json").is_file()  # model.json kept
    assert _put(dl_srv, "/v1/models/fetched/start").status_code == 200
    assert wait_until(lambda: _state(dl_srv, "fetched") == "running", timeout=120), dl_srv.log()
    code, body = _complete(dl_srv, "fetched")
    assert code == 200 and body["usage"]["completion_tokens"] == 4
    assert not any(p.name.startswith(".") for p in dl_srv.models.iterdir())


def test_bad_archives_leave_nothing_behind(dl_srv):
    for mid, words in (("evil", "would leave"), ("missing", "404")):
        assert dl_srv.get(f"/v1/models/download/{mid}", "management").status_code == 200  # checked source, fetched later
        assert wait_until(lambda: _state(dl_srv, mid) == "not_downloaded", timeout=30)
        got = dl_srv.get(f"/v1/models/{mid}").json()
        assert words in got["metadata"]["error"]
        assert sorted(p.name for p in (dl_srv.models / mid).iterdir()) == ["model.json"]
    assert not (dl_srv.models / "escaped.txt").exists() and not (dl_srv.tmp / "escaped.txt").exists()
    assert not any(p.name.startswith(".") for p in dl_srv.models.iterdir())
    assert dl_srv.get("/health", "management").status_code == 200


def test_a_stopped_default_model_is_loaded_again_by_the_mindie_and_tgi_routes(dl_srv):
    body = {"inputs": "River", "parameters": {"max_new_tokens": 2}}
    assert dl_srv.post("/", body).status_code == 200
    for path in ("/", "/generate"):
        assert _put(dl_srv, "/v1/models/mock/stop").status_code == 200
        assert wait_until(lambda: _state(dl_srv, "mock") == "stopped", timeout=30)
        assert dl_srv.get("/health", "management").status_code == 503  # stopped by the operator: not ready
        r = dl_srv.post(path, body)  # loads it (issue 46: the route serves the default model)
        assert r.status_code == 200, r.text
        assert _state(dl_srv, "mock") == "running" and dl_srv.get("/health", "management").status_code == 200


def _rss(srv: ServerProcess) -> int:
    for line in Path(f"/proc/{srv.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_stop_frees_the_models_memory(dl_srv):
    """The `small` demo model (~120 MB of float32 weights): the server's RSS grows by about that much while
    it runs and drops again once it is stopped."""
    from mindie_service.devkit.presets import build_demo_model

    folder = dl_srv.models / "small"
    build_demo_model("small", str(folder), if_missing=True)
    weights = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    before = _rss(dl_srv)
    assert _put(dl_srv, "/v1/models/small/start").status_code == 200
    assert wait_until(lambda: _state(dl_srv, "small") == "running", timeout=180), dl_srv.log()
    assert _complete(dl_srv, "small")[0] == 200
    running = _rss(dl_srv)
    assert running - before > 0.8 * weights
    assert _put(dl_srv, "/v1/models/small/stop").status_code == 200
    assert wait_until(lambda: _state(dl_srv, "small") == "stopped", timeout=60)
    assert wait_until(lambda: _rss(dl_srv) < running - 0.7 * weights, timeout=10), (before, running, _rss(dl_srv))

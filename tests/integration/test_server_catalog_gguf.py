"""GGUF models in the catalog over HTTP: the demo ``tiny`` model written as .gguf files (tests/gguf_files.py).
The default model is a GGUF with Q8_0 and F16 tensors (/info says what loading did to each kind); a folder
holding tiny's F32 .gguf is scanned, started, answers exactly as tiny's safetensors do, is stopped and deleted;
a malformed and a truncated .gguf each leave their model failed with a load error naming the file while the
others serve; an unknown model.json format is refused; a single .gguf is downloaded over http (as the
source_url, and as an asset), staged, moved into place and served."""
from __future__ import annotations

import functools
import http.server
import json
import shutil
import threading
from pathlib import Path

import pytest
import requests

from tests.gguf_files import write_gguf
from tests.server_utils import ServerProcess, wait_until, write_config

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.slow
T = gguf.GGMLQuantizationType
MIXED = {**{f"blk.{i}.ffn_down.weight": T.Q8_0 for i in range(4)},
         **{f"blk.{i}.attn_v.weight": T.F16 for i in range(4)}}


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass


def _model(root: Path, name: str, gguf_file: Path | None = None, model_json: dict | None = None) -> Path:
    d = root / name
    d.mkdir(parents=True)
    if gguf_file is not None:
        shutil.copy(gguf_file, d / gguf_file.name)
    if model_json is not None:
        (d / "model.json").write_text(json.dumps(model_json))
    return d


@pytest.fixture(scope="module")
def srv(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("catalog_gguf")
    files, models = tmp / "files", tmp / "models"
    files.mkdir()
    f32 = write_gguf(tiny_model, files / "tiny.gguf")
    (tmp / "mixed").mkdir()
    mixed = write_gguf(tiny_model, tmp / "mixed" / "tiny-mixed.gguf", types=MIXED)
    shutil.copytree(tiny_model, models / "tiny-st")
    _model(models, "tiny-gguf", f32, {"format": "ggufv3", "parameters": {"temperature": "0"}})
    bad = _model(models, "broken")
    (bad / "broken.gguf").write_bytes(b"NOPE" + b"\0" * 64)
    cut = _model(models, "cut")
    (cut / "cut.gguf").write_bytes(f32.read_bytes()[: f32.stat().st_size // 2])
    _model(models, "onnx", f32, {"format": "onnx"})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(files)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    _model(models, "dl-url", model_json={"source_url": f"{base}/tiny.gguf", "format": "gguf"})
    _model(models, "dl-asset", model_json={"source_url": base, "assets": ["tiny.gguf"]})
    cfg = write_config(tmp / "config.json", mixed.parent, model_name="mixed",
                       server={"allowPrivateMediaUrls": True}, deploy={"modelsDir": str(models)})
    s = ServerProcess(cfg, tmp / "server.log").start().wait_ready()
    s.models = models
    yield s
    s.stop()
    httpd.shutdown()


def _put(srv: ServerProcess, path: str) -> requests.Response:
    return requests.put(srv.url("management") + path, timeout=30)


def _state(srv: ServerProcess, mid: str) -> str:
    return srv.get(f"/v1/models/{mid}").json()["state"]


def _start(srv: ServerProcess, mid: str) -> None:
    r = _put(srv, f"/v1/models/{mid}/start")
    assert r.status_code == 200, r.text
    assert wait_until(lambda: _state(srv, mid) == "running", timeout=120), srv.log()


def _greedy(srv: ServerProcess, model: str) -> str:
    r = srv.post("/v1/completions", {"model": model, "prompt": "River mountain", "max_tokens": 8,
                                     "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_info_and_the_model_say_what_loading_did_to_each_tensor_kind(srv):
    info = srv.get("/info").json()
    packed = {f"blk.{i}.ffn_down.weight": "Q8_0: kept packed" for i in range(4)}  # run as stored (issue 44)
    int8 = ("int8 per 16 columns of x (per 256: K-quants) in decode steps, fp32 in prefill pieces and fp32 in the LM "
            "head")  # ggufActivations' default
    assert info["weights_report"] == {"F16": "4 tensors: converted from F16", "F32": "31 tensors: kept",
                                      "Q8_0": "4 tensors: kept packed", "GGUF activations": int8, **packed}
    got = srv.get("/v1/models/mixed").json()
    assert got["weights_report"] == info["weights_report"] and got["format"] == "gguf"
    assert _greedy(srv, "mixed")


def test_a_gguf_folder_is_scanned_started_served_stopped_and_deleted(srv):
    listed = {m["id"]: m for m in srv.get("/v1/models").json()["data"]}
    assert listed["tiny-gguf"]["format"] == "ggufv3" and listed["broken"]["format"] == "gguf"
    assert _state(srv, "tiny-gguf") == "downloaded"
    _start(srv, "tiny-gguf")
    _start(srv, "tiny-st")
    assert _greedy(srv, "tiny-gguf") == _greedy(srv, "tiny-st")  # the same weights, the same tokenizer
    got = srv.get("/v1/models/tiny-gguf").json()
    assert got["weights_report"] == {"F32": "39 tensors: kept"}
    chat = srv.post("/v1/chat/completions", {"model": "tiny-gguf", "max_tokens": 4,
                                              "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 200, chat.text  # the chat template came from tokenizer.chat_template
    assert _put(srv, "/v1/models/tiny-gguf/stop").status_code == 200
    assert wait_until(lambda: _state(srv, "tiny-gguf") == "stopped", timeout=60)
    r = requests.delete(srv.url("management") + "/v1/models/tiny-gguf", timeout=30)
    assert r.status_code == 200 and not (srv.models / "tiny-gguf").exists()


def test_a_malformed_gguf_fails_its_model_and_the_others_keep_serving(srv):
    for mid, words in (("broken", "broken.gguf is malformed"), ("cut", "cut.gguf is truncated")):
        assert _put(srv, f"/v1/models/{mid}/start").status_code == 200
        assert wait_until(lambda: "load_error" in srv.get(f"/v1/models/{mid}").json(), timeout=60), srv.log()
        got = srv.get(f"/v1/models/{mid}").json()
        assert got["state"] == "stopped" and words in got["load_error"], got["load_error"]
        assert str(srv.models / mid) in got["load_error"]  # the file, by its path
    assert _greedy(srv, "mixed") and srv.get("/health", "management").status_code == 200


def test_an_unknown_format_is_refused_naming_it(srv):
    r = _put(srv, "/v1/models/onnx/start")
    assert r.status_code == 400 and "format 'onnx' is not one this service runs" in r.json()["error"]["message"]
    assert _state(srv, "onnx") == "downloaded"


@pytest.mark.parametrize("mid", ["dl-url", "dl-asset"])
def test_a_single_gguf_is_downloaded_then_served(srv, mid):
    assert _state(srv, mid) == "not_downloaded"
    r = srv.get(f"/v1/models/download/{mid}", "management")
    assert r.status_code == 200, r.text
    assert wait_until(lambda: _state(srv, mid) == "downloaded", timeout=60), srv.log()
    assert sorted(p.name for p in (srv.models / mid).iterdir()) == ["model.json", "tiny.gguf"]
    assert not any(p.name.startswith(".") for p in srv.models.iterdir())  # staging gone
    got = srv.get(f"/v1/models/{mid}").json()
    assert got["metadata"]["download"]["bytes_done"] == (srv.models / mid / "tiny.gguf").stat().st_size
    _start(srv, mid)
    if _state(srv, "tiny-st") != "running":  # whichever of this module's tests a worker runs first
        _start(srv, "tiny-st")
    assert _greedy(srv, mid) == _greedy(srv, "tiny-st")

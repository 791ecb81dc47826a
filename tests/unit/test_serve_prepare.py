"""`serve --prepare` (what `make serve` runs) never writes into a user's model folder (issue 43): it places only
the packaged default model and the development certificates, and only where nothing exists yet. A mistyped
``modelWeightPath`` is the ordinary config error; a folder holding the user's ``.gguf``, or the ``.gguf`` file
itself, is served from that file. Each user folder is byte-identical afterwards. Served in this process (the
real `serve` path, stopped by ``POST /stopService`` once ready)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import requests

from mindie_service.config import ServiceConfig, load_config
from mindie_service.serve_wiring import cli_wiring, prepare_assets
from mindie_service.server.main import serve
from tests.gguf_files import write_gguf
from tests.server_utils import write_config

pytest.importorskip("gguf")


def _tree(root: Path) -> dict[str, str | None]:
    """Every entry under ``root``: a file's sha256, None for a folder (names and bytes, nothing else)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
            for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def tiny_gguf(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(tiny_model, tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture
def user_folder(tmp_path: Path, tiny_gguf: Path) -> Path:
    """A user's model folder: their .gguf and a note beside it."""
    d = tmp_path / "my-model"
    d.mkdir()
    shutil.copy(tiny_gguf, d / "my.gguf")
    (d / "notes.txt").write_text("my model, converted by hand\n")
    return d


def _conf(tmp_path: Path, model: Path, **kw: Any) -> Path:
    (tmp_path / "conf").mkdir(exist_ok=True)
    return write_config(tmp_path / "conf" / "config.json", model, **kw)


def _serve_and_ask(cfg_path: Path) -> tuple[int, dict[str, Any]]:
    """`serve --prepare` on ``cfg_path`` in this process; once ready, /info and /v1/models are read and the
    server is stopped. Returns the exit code and the answers."""
    got: dict[str, Any] = {}

    def ask(cfg: ServiceConfig) -> None:
        base, mgmt = (f"http://127.0.0.1:{p}" for p in (cfg.server.port, cfg.server.management_port))
        try:
            got["info"] = requests.get(base + "/info", timeout=60).json()
            got["models"] = requests.get(base + "/v1/models", timeout=60).json()["data"]
        finally:
            requests.post(mgmt + "/stopService", json={}, timeout=60)

    def banner(cfg: ServiceConfig) -> str:
        threading.Thread(target=ask, args=(cfg,), daemon=True).start()
        return "ready"

    switch = sys.getswitchinterval()
    try:
        code = serve(str(cfg_path), dataclasses.replace(cli_wiring(True), ready_banner=banner))
    finally:
        sys.setswitchinterval(switch)
    return code, got


FOLDER, FILE, ODD = "folder not found: {p}", "file not found: {p}", "{p} is a file but not a .gguf file"


@pytest.mark.parametrize("typo, words", [("my-modle", FOLDER), ("small", FOLDER), ("my-model/my.ggfu", FOLDER),
                                         ("my-model/mine.gguf", FILE), ("my-model/notes.txt", ODD)],
                         ids=["mistyped", "a-demo-preset-name", "mistyped-suffix", "missing-gguf", "not-a-checkpoint"])
def test_a_mistyped_folder_is_the_config_error_and_nothing_is_written(tmp_path, user_folder, typo, words, capsys):
    cfg = _conf(tmp_path, tmp_path / typo, model_name="my-model")
    before = _tree(tmp_path)
    code, _ = _serve_and_ask(cfg)  # (stopped once ready, should it serve)
    assert code == 2
    err = capsys.readouterr().err
    assert "ModelConfig[0].modelWeightPath: " + words.format(p=tmp_path / typo) in err, err
    assert _tree(tmp_path) == before  # no demo model built, no staging folder left, the user's folder as it was


@pytest.mark.parametrize("target", ["folder", "file"], ids=["folder-holding-the-gguf", "path-naming-the-gguf"])
def test_the_users_gguf_is_served_and_its_folder_untouched(tmp_path, user_folder, target):
    path = user_folder if target == "folder" else user_folder / "my.gguf"
    cfg = _conf(tmp_path, path, model_name="my-model")
    before = _tree(user_folder)
    code, got = _serve_and_ask(cfg)
    assert code == 0 and got, got
    assert "F32" in got["info"]["weights_report"]  # read from the .gguf (a safetensors folder reports nothing)
    assert got["info"]["demo_weights"] is False
    [model] = got["models"]
    assert model["id"] == "my-model" and model["demo_weights"] is False
    assert _tree(user_folder) == before


def test_demo_weights_say_so_in_the_log_info_and_models(tmp_path, tiny_model, caplog):
    cfg = _conf(tmp_path, tiny_model)
    with caplog.at_level(logging.WARNING, logger="mindie_service"):
        code, got = _serve_and_ask(cfg)
    assert code == 0 and got["info"]["demo_weights"] is True and got["models"][0]["demo_weights"] is True
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "demo weights" in r.message]
    assert warned and "gibberish" in warned[0] and str(tiny_model) in warned[0], warned


def test_a_gguf_beside_an_old_prepare_s_demo_files_is_read_from_the_gguf(tmp_path, tiny_model, tiny_gguf):
    """A folder an older `serve --prepare` wrote a demo model into, beside the user's .gguf: the .gguf is read."""
    from mindie_service.catalog.checkpoint_kind import detect
    from mindie_service.config import check_files
    from mindie_service.models.demo_marker import demo_checkpoint
    from mindie_service.models.gguf_checkpoint import find_gguf, load_tokenizer

    d = tmp_path / "polluted"
    shutil.copytree(tiny_model, d)
    shutil.copy(tiny_gguf, d / "my.gguf")
    assert find_gguf(d) == d / "my.gguf" and detect(d) == "gguf" and demo_checkpoint(d) is None
    check_files(load_config(write_config(tmp_path / "config.json", d)))
    assert demo_checkpoint(tiny_model) is not None and find_gguf(tiny_model) is None
    text = "The capital of France is"
    assert load_tokenizer(d).encode(text) == load_tokenizer(d / "my.gguf").encode(text)


def test_prepare_places_the_packaged_model_only_into_a_missing_folder(tmp_path, monkeypatch, tiny_gguf):
    """The packaged default model is placed into a folder that does not exist (whole, renamed into place); a
    folder of that name that exists, empty or not, is left as it is and check_files names what is missing."""
    from mindie_service.config import check_files
    from mindie_service.errors import ConfigError
    from mindie_service.models import packaged_models

    monkeypatch.setattr(packaged_models, "packaged_file", lambda name: tiny_gguf)
    folder = tmp_path / "models" / "SmolLM2-135M-Instruct"
    cfg = load_config(write_config(tmp_path / "config.json", folder))
    prepare_assets(cfg)
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # no staging folder left
    assert (folder / tiny_gguf.name).read_bytes() == tiny_gguf.read_bytes()
    shutil.rmtree(folder)
    folder.mkdir()
    before = _tree(tmp_path)
    prepare_assets(cfg)
    assert _tree(tmp_path) == before
    with pytest.raises(ConfigError, match=r"modelWeightPath: .*config.json not found \(a checkpoint folder holds"):
        check_files(cfg)


def test_prepare_writes_dev_certificates_only_where_none_is(tmp_path):
    """The dev certificates are written where the gen-certs layout holds none; beside some of them, none."""
    from mindie_service.devkit.certs import DEV_FILES

    sec = tmp_path / "security"
    tls = {"httpsEnabled": True, "tlsCaPath": str(sec / "ca"), "tlsCaFile": ["ca.pem"],
           "tlsCert": str(sec / "certs/server.pem"), "tlsPk": str(sec / "keys/server.key.pem"), "tlsCrlFiles": []}
    cfg = load_config(write_config(tmp_path / "config.json", tmp_path / "none", server=tls,
                                   deploy={"ModelConfig": [{"modelInstanceType": "StandardMock", "modelName": "m",
                                                            "modelWeightPath": "none"}]}))
    prepare_assets(cfg)
    assert all((sec / f).is_file() for f in DEV_FILES)
    (sec / "keys/client.key.pem").unlink()
    before = _tree(sec)
    prepare_assets(cfg)
    assert _tree(sec) == before  # the user's (or an old) set is never mixed with a new CA
    assert json.loads((tmp_path / "config.json").read_text())  # the config itself is untouched

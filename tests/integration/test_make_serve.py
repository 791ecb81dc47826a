"""`make serve`'s path on a bare folder: `serve --prepare` writes the development certificates a config names
(and never a demo model: that is `demo-model`'s job), then serves HTTPS with mutual TLS; `gen-certs` writes the
same layout, keeps it with --if-missing, refuses to replace it without --force."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mindie_service.devkit.certs import DEV_FILES
from mindie_service.devkit.presets import is_current
from tests.server_utils import ROOT, ServerProcess, launch, write_config


def test_the_makefile_serves_with_prepare():
    recipe = (ROOT / "Makefile").read_text().split("\nserve:", 1)[1].split("\n\n", 1)[0]
    assert "-m mindie_service serve --config $(CONFIG) --prepare" in recipe


def test_gen_certs_writes_the_dev_layout_keeps_it_and_replaces_it_only_with_force(tmp_path):
    out = tmp_path / "security"
    cmd = [sys.executable, "-m", "mindie_service", "gen-certs", "--out", str(out)]
    assert subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=120).returncode == 0
    written = {f: (out / f).read_bytes() for f in DEV_FILES}
    assert subprocess.run([*cmd, "--if-missing"], cwd=ROOT, capture_output=True, timeout=120).returncode == 0
    assert {f: (out / f).read_bytes() for f in DEV_FILES} == written  # kept as they were
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--force" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert {f: (out / f).read_bytes() for f in DEV_FILES} == written  # a running server's CA is not replaced
    assert subprocess.run([*cmd, "--force"], cwd=ROOT, capture_output=True, timeout=120).returncode == 0
    assert (out / "ca/ca.pem").read_bytes() != written["ca/ca.pem"]  # with --force: a new CA


def test_serve_prepare_on_a_bare_folder_writes_the_certificates_and_serves_https(tmp_path):
    """The shipped config's shape: paths relative to conf/, the model and security folders beside it; the
    security folder absent, the demo model built by `demo-model` as the README shows."""
    conf = tmp_path / "conf"
    conf.mkdir()
    sec = tmp_path / "security"
    build = [sys.executable, "-m", "mindie_service", "demo-model", "--preset", "tiny", "--out",
             str(tmp_path / "models" / "tiny")]
    assert subprocess.run(build, cwd=ROOT, capture_output=True, timeout=300).returncode == 0

    def make() -> ServerProcess:
        cfg = write_config(conf / "config.json", Path("../models/tiny"), server={
            "httpsEnabled": True, "tlsCaPath": "../security/ca/", "tlsCaFile": ["ca.pem"],
            "tlsCert": "../security/certs/server.pem", "tlsPk": "../security/keys/server.key.pem",
            "tlsCrlFiles": []})
        return ServerProcess(cfg, tmp_path / "server.log", verify=str(sec / "ca/ca.pem"),
                             cert=(str(sec / "certs/client.pem"), str(sec / "keys/client.key.pem")),
                             args=("--prepare",))

    srv = launch(make)
    try:
        assert is_current(tmp_path / "models" / "tiny")
        assert all((sec / f).is_file() for f in DEV_FILES)
        assert srv.url().startswith("https://")
        r = srv.post("/", {"inputs": "My name is Olivier and I", "parameters": {"max_new_tokens": 4}})
        assert r.status_code == 200 and isinstance(r.json()[0]["generated_text"], str)
        assert "building the demo model" not in srv.log() and "demo weights" in srv.log()
    finally:
        srv.stop()

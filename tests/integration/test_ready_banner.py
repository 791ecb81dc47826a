"""The curl line `make serve` prints once ready (serve_wiring.curl_line) works pasted, for every TLS setting:
plain HTTP, server-only TLS (an empty tlsCaFile: no client certificate, but the server's CA still trusted),
mutual TLS; with business API keys it carries the Authorization header to fill in."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from mindie_service.config import load_config
from mindie_service.devkit.certs import generate_dev_certs
from mindie_service.serve_wiring import curl_line
from tests.server_utils import ServerProcess, launch, write_config

TLS = {"httpsEnabled": True, "tlsCaPath": "../security/ca/", "tlsCert": "../security/certs/server.pem",
       "tlsPk": "../security/keys/server.key.pem", "tlsCrlFiles": []}


def _cfg(tmp: Path, tiny: Path, **server):
    (tmp / "conf").mkdir(exist_ok=True)
    return load_config(write_config(tmp / "conf" / "config.json", tiny, server=server))


def test_the_line_for_each_tls_setting(tmp_path, tiny_model):
    generate_dev_certs(str(tmp_path / "security"), if_missing=True)
    sec = tmp_path / "security"
    plain = curl_line(_cfg(tmp_path, tiny_model, httpsEnabled=False))
    assert "http://127.0.0.1:" in plain and "--cacert" not in plain and "--cert" not in plain
    server_only = curl_line(_cfg(tmp_path, tiny_model, **TLS, tlsCaFile=[]))
    assert f"--cacert {sec / 'ca/ca.pem'}" in server_only and "--cert" not in server_only
    mutual = curl_line(_cfg(tmp_path, tiny_model, **TLS, tlsCaFile=["ca.pem"]))
    assert f"--cacert {sec / 'ca/ca.pem'}" in mutual and f"--cert {sec / 'certs/client.pem'}" in mutual
    assert "Authorization" not in mutual


def test_the_line_says_how_to_add_the_api_key(tmp_path, tiny_model):
    line = curl_line(_cfg(tmp_path, tiny_model, httpsEnabled=False, businessApiKeys=["k-123456789012345678"]))
    assert '-H "Authorization: Bearer $MINDIE_API_KEY"' in line and "businessApiKeys" in line
    assert "k-1234" not in line  # the key itself is never printed
    other = curl_line(_cfg(tmp_path, tiny_model, httpsEnabled=False, managementApiKeys=["m-123456789012345678"]))
    assert "Authorization" not in other


@pytest.mark.parametrize("ca_files", [[], ["ca.pem"]], ids=["server-only-tls", "mutual-tls"])
def test_the_printed_line_answers_when_pasted(tmp_path, tiny_model, ca_files):
    sec = tmp_path / "security"

    def make() -> ServerProcess:
        (tmp_path / "conf").mkdir(exist_ok=True)
        cfg = write_config(tmp_path / "conf" / "config.json", tiny_model, server={**TLS, "tlsCaFile": ca_files})
        return ServerProcess(cfg, tmp_path / "server.log", verify=str(sec / "ca/ca.pem"),
                             cert=(str(sec / "certs/client.pem"), str(sec / "keys/client.key.pem")),
                             args=("--prepare",))

    srv = launch(make)
    try:
        log = srv.log()
        line = log.split("mindie-service is ready. Try:\n\n  ", 1)[1].split("\n", 1)[0]
        assert line.startswith("curl ")
        r = subprocess.run(["bash", "-c", line + " --fail --silent --show-error --max-time 60"],
                           capture_output=True, text=True, timeout=90, env=dict(os.environ))
        assert r.returncode == 0, (line, r.stderr)
        assert "generated_text" in r.stdout
    finally:
        srv.stop()

"""ServerConfig.probePort: with mutual TLS on every plane (a kubelet probe cannot present a client certificate),
the health routes are served on a plain-HTTP port of their own, and nothing else is."""
from __future__ import annotations

import json

import pytest
import requests

from mindie_service.config import load_config
from mindie_service.devkit import certs
from mindie_service.errors import ConfigError
from tests.server_utils import ServerProcess, free_port, write_mock_config


def _config(tmp, probe: int, **server):
    sec = tmp / "security"
    certs.generate_dev_certs(str(sec))
    path = write_mock_config(tmp, ipAddress="127.0.0.1", port=free_port(), managementPort=free_port(),
                             metricsPort=free_port(), probePort=probe, httpsEnabled=True,
                             tlsCaPath=str(sec / "ca"), tlsCaFile=["ca.pem"], tlsCert=str(sec / "certs/server.pem"),
                             tlsPk=str(sec / "keys/server.key.pem"), tlsCrlFiles=[], **server)
    return path, sec


def test_probe_port_serves_the_health_routes_without_a_client_certificate(tmp_path):
    probe = free_port()
    path, sec = _config(tmp_path, probe)
    srv = ServerProcess(path, tmp_path / "server.log", verify=str(sec / "ca/ca.pem"),
                        cert=(str(sec / "certs/client.pem"), str(sec / "keys/client.key.pem"))).start()
    try:
        srv.wait_ready(60)
        base = f"http://127.0.0.1:{probe}"
        assert requests.get(base + "/v2/health/live", timeout=10).json() == {"status": "live"}
        assert requests.get(base + "/v2/health/ready", timeout=10).status_code == 200
        assert requests.get(base + "/health", timeout=10).status_code == 200
        for path_ in ("/v1/status", "/metrics", "/v1/config", "/stopService"):
            assert requests.get(base + path_, timeout=10).status_code == 404, path_
        # the management port itself still asks for a client certificate
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(srv.url("management") + "/v2/health/live", verify=str(sec / "ca/ca.pem"), timeout=10)
        assert srv.get("/v2/health/live", "management").status_code == 200  # with one
    finally:
        srv.stop()


def test_probe_port_must_be_a_port_of_its_own(tmp_path):
    cfg = json.loads(write_mock_config(tmp_path).read_text())
    cfg["ServerConfig"].update(port=2001, probePort=2001)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="probePort must differ"):
        load_config(tmp_path / "config.json")

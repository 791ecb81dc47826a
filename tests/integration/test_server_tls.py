"""HTTPS: TLS 1.3 only, mutual TLS against the configured CA, CRLs honoured, an encrypted server key
opened with tlsPkPwd; start-up refuses bad TLS material naming the config key."""
from __future__ import annotations

import datetime as dt
import json
import ssl
from pathlib import Path

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from mindie_service.config import TlsSettings
from mindie_service.errors import ConfigError
from mindie_service.devkit import certs
from mindie_service.server.tls import build_ssl_context
from tests.server_utils import ServerProcess, shared_server, write_config

PASSWORD = b"correct horse battery staple"


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    root = tmp_path_factory.mktemp("pki")
    sec = root / "security"
    assert certs.generate_dev_certs(str(sec)) is True
    assert certs.generate_dev_certs(str(sec), if_missing=True) is False  # kept as is
    ca = certs.Issued(x509.load_pem_x509_certificate((sec / "ca/ca.pem").read_bytes()),
                      serialization.load_pem_private_key((sec / "ca/ca.key.pem").read_bytes(), None))
    revoked = certs.issue(ca, "revoked client", server=False)
    certs.write_cert(sec / "certs/revoked.pem", revoked.cert)
    certs.write_key(sec / "keys/revoked.key.pem", revoked.key)
    certs.write_crl(sec / "crl/ca.crl.pem", certs.make_crl(ca, [revoked.cert]))
    foreign_ca = certs.make_ca("someone else's CA")
    foreign = certs.issue(foreign_ca, "foreign client", server=False)
    certs.write_cert(sec / "certs/foreign.pem", foreign.cert)
    certs.write_key(sec / "keys/foreign.key.pem", foreign.key)
    # the server key, encrypted, with its password in a file (tlsPkPwd)
    server_key = serialization.load_pem_private_key((sec / "keys/server.key.pem").read_bytes(), None)
    certs.write_key(sec / "keys/server.enc.key.pem", server_key, password=PASSWORD)
    (sec / "keys/server.pwd").write_bytes(PASSWORD + b"\n")
    return sec


def client(sec: Path, name: str) -> tuple[str, str]:
    return str(sec / f"certs/{name}.pem"), str(sec / f"keys/{name}.key.pem")


@pytest.fixture(scope="session")
def tls_srv(request, tiny_model, pki):
    def make(tmp: Path) -> ServerProcess:
        cfg = write_config(tmp / "config.json", tiny_model, server={
            "httpsEnabled": True, "tlsCaPath": str(pki / "ca"), "tlsCaFile": ["ca.pem"],
            "tlsCert": str(pki / "certs/server.pem"), "tlsPk": str(pki / "keys/server.enc.key.pem"),
            "tlsPkPwd": str(pki / "keys/server.pwd"), "tlsCrlPath": str(pki / "crl"), "tlsCrlFiles": ["ca.crl.pem"]})
        return ServerProcess(cfg, tmp / "server.log", verify=str(pki / "ca/ca.pem"), cert=client(pki, "client"))
    return shared_server("tls", request, make)


def test_client_with_the_right_certificate_gets_200(tls_srv):
    assert tls_srv.url().startswith("https://")
    r = tls_srv.post("/", {"inputs": "hello", "parameters": {"max_new_tokens": 3}})
    assert r.status_code == 200 and isinstance(r.json()[0]["generated_text"], str)
    assert tls_srv.get("/metrics", "metrics").status_code == 200


@pytest.mark.parametrize("cert", [None, "foreign", "revoked"])
def test_no_foreign_or_revoked_client_certificate_is_refused_at_the_handshake(tls_srv, pki, cert):
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.post(tls_srv.url() + "/", json={"inputs": "hello"}, verify=str(pki / "ca/ca.pem"),
                      cert=client(pki, cert) if cert else None, timeout=10)


def test_tls_below_1_3_is_refused(tls_srv, pki):
    ctx = ssl.create_default_context(cafile=str(pki / "ca/ca.pem"))
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(*client(pki, "client"))
    port = int(tls_srv.url().rsplit(":", 1)[1])
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            with ctx.wrap_socket(sock, server_hostname="localhost") as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
                s.recv(100)


# -- start-up refuses bad material, naming the key -------------------------------------------------
def settings(sec: Path, **kw) -> TlsSettings:
    base = dict(ca_path=str(sec / "ca"), ca_files=(str(sec / "ca/ca.pem"),), cert=str(sec / "certs/server.pem"),
                pk=str(sec / "keys/server.key.pem"), pk_pwd=None, crl_path=None, crl_files=())
    base.update(kw)
    return TlsSettings(**base)


def test_context_is_tls13_only_with_client_certificates_required(pki):
    ctx = build_ssl_context(settings(pki, crl_files=(str(pki / "crl/ca.crl.pem"),)))
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_3 and ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.verify_flags & ssl.VERIFY_CRL_CHECK_LEAF
    assert build_ssl_context(settings(pki, ca_files=())).verify_mode == ssl.CERT_NONE


def test_encrypted_key_needs_the_right_password(pki, tmp_path):
    enc = str(pki / "keys/server.enc.key.pem")
    build_ssl_context(settings(pki, pk=enc, pk_pwd=str(pki / "keys/server.pwd")))
    wrong = tmp_path / "wrong.pwd"
    wrong.write_text("nope")
    with pytest.raises(ConfigError, match="ServerConfig.tlsPk"):
        build_ssl_context(settings(pki, pk=enc, pk_pwd=str(wrong)))
    with pytest.raises(ConfigError, match="ServerConfig.tlsPk"):
        build_ssl_context(settings(pki, pk=enc))


@pytest.mark.parametrize("field,key", [("cert", "tlsCert"), ("pk", "tlsPk"), ("pk_pwd", "tlsPkPwd")])
def test_missing_file_names_its_key(pki, field, key):
    with pytest.raises(ConfigError, match=f"ServerConfig.{key}: cannot read"):
        build_ssl_context(settings(pki, **{field: str(pki / "nope.pem")}))


def test_missing_ca_and_crl_name_their_keys(pki):
    with pytest.raises(ConfigError, match="ServerConfig.managementTlsCaFile"):
        build_ssl_context(settings(pki, ca_files=(str(pki / "nope.pem"),)), "managementTls")
    with pytest.raises(ConfigError, match="ServerConfig.tlsCrlFiles"):
        build_ssl_context(settings(pki, crl_files=(str(pki / "nope.pem"),)))


def test_weak_mismatched_and_expired_material_is_refused(pki, tmp_path):
    ca = certs.make_ca("weak CA", key=certs.new_key(2048))
    certs.write_cert(tmp_path / "weak.pem", ca.cert)
    certs.write_key(tmp_path / "weak.key.pem", ca.key)
    with pytest.raises(ConfigError, match="at least 3072"):
        build_ssl_context(settings(pki, cert=str(tmp_path / "weak.pem"), pk=str(tmp_path / "weak.key.pem")))
    with pytest.raises(ConfigError, match="does not match the certificate"):
        build_ssl_context(settings(pki, pk=str(pki / "keys/client.key.pem")))
    ca_key = serialization.load_pem_private_key((pki / "ca/ca.key.pem").read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate((pki / "ca/ca.pem").read_bytes())
    now = dt.datetime.now(dt.timezone.utc)
    old = (x509.CertificateRevocationListBuilder().issuer_name(ca_cert.subject)
           .last_update(now - dt.timedelta(days=10)).next_update(now - dt.timedelta(days=1)).sign(ca_key, hashes.SHA256()))
    certs.write_crl(tmp_path / "old.crl.pem", old)
    with pytest.raises(ConfigError, match="tlsCrlFiles.*expired"):
        build_ssl_context(settings(pki, crl_files=(str(tmp_path / "old.crl.pem"),)))


def test_serve_stops_with_a_message_naming_the_key(tiny_model, tmp_path, capsys):
    from mindie_service.server.main import serve

    cfg = write_config(tmp_path / "config.json", tiny_model, server={
        "httpsEnabled": True, "tlsCaPath": str(tmp_path), "tlsCaFile": ["ca.pem"],
        "tlsCert": str(tmp_path / "server.pem"), "tlsPk": str(tmp_path / "server.key.pem")})
    assert serve(str(cfg)) == 2
    assert "ServerConfig.tlsCert" in capsys.readouterr().err
    data = json.loads(cfg.read_text())
    data["ServerConfig"].update(httpsEnabled=False, ipAddress="0.0.0.0")
    cfg.write_text(json.dumps(data))
    assert serve(str(cfg)) == 2
    assert "allowAllZeroIpListening" in capsys.readouterr().err

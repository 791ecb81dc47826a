"""HTTPS: TLS 1.3 only, mutual TLS against the configured CA, CRLs honoured, an encrypted server key
opened with tlsPkPwd; start-up refuses bad TLS material naming the config key."""
from __future__ import annotations

import datetime as dt
import json
import socket
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


def tls_alert(port: int, pki: Path, cert: str | None, max_version: ssl.TLSVersion | None = None) -> str:
    """The reason of the TLS error a client gets from the server (an alert, named by OpenSSL), or "" when the
    request goes through. In TLS 1.3 the server judges the client certificate after the client's side of the
    handshake is done: its alert arrives at the first read. The client sends nothing before that read: data
    the server has not read when it closes makes the kernel reset the connection, and the alert is lost."""
    ctx = ssl.create_default_context(cafile=str(pki / "ca/ca.pem"))
    if max_version is not None:
        ctx.maximum_version = max_version
    if cert:
        ctx.load_cert_chain(*client(pki, cert))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            with ctx.wrap_socket(sock, server_hostname="localhost") as s:
                s.settimeout(5)
                try:
                    return f"unasked data {s.recv(100)!r}"  # only an alert comes unasked
                except TimeoutError:
                    pass  # accepted: now ask
                s.settimeout(10)
                s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
                return "" if s.recv(100).startswith(b"HTTP/1.1") else "no HTTP answer"
        except ssl.SSLError as e:
            return str(e.reason)


@pytest.mark.parametrize("cert,alert", [(None, "TLSV13_ALERT_CERTIFICATE_REQUIRED"),
                                        ("foreign", "TLSV1_ALERT_UNKNOWN_CA"),
                                        ("revoked", "SSLV3_ALERT_CERTIFICATE_REVOKED")])
def test_no_foreign_or_revoked_client_certificate_is_refused_at_the_handshake(tls_srv, pki, cert, alert):
    assert tls_alert(tls_srv.cfg["port"], pki, cert) == alert


def test_the_same_raw_client_with_the_right_certificate_is_answered(tls_srv, pki):
    assert tls_alert(tls_srv.cfg["port"], pki, "client") == ""


def test_tls_below_1_3_is_refused(tls_srv, pki):
    assert tls_alert(tls_srv.cfg["port"], pki, "client", ssl.TLSVersion.TLSv1_2) == "TLSV1_ALERT_PROTOCOL_VERSION"


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
    ca = certs.make_ca("weak CA", key=certs.rsa_key(2048))
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


# -- each plane its own TLS at run time -------------------------------------------------------------
@pytest.fixture(scope="session")
def planes_srv(request, tiny_model, pki):
    """Business: the dev server certificate, client certificates from the dev CA (CRL on). Management: its own
    certificate, no client certificate (an empty managementTlsCaFile). Metrics: clients of another CA only."""
    ca = certs.Issued(x509.load_pem_x509_certificate((pki / "ca/ca.pem").read_bytes()),
                      serialization.load_pem_private_key((pki / "ca/ca.key.pem").read_bytes(), None))
    mgmt = certs.issue(ca, "management plane", server=True, hosts=("localhost", "127.0.0.1"))
    certs.write_cert(pki / "certs/management.pem", mgmt.cert)
    certs.write_key(pki / "keys/management.key.pem", mgmt.key)
    other_ca = certs.make_ca("metrics clients CA")
    certs.write_cert(pki / "ca/metrics-ca.pem", other_ca.cert)
    scraper = certs.issue(other_ca, "scraper", server=False)
    certs.write_cert(pki / "certs/scraper.pem", scraper.cert)
    certs.write_key(pki / "keys/scraper.key.pem", scraper.key)

    def make(tmp: Path) -> ServerProcess:
        cfg = write_config(tmp / "config.json", tiny_model, server={
            "httpsEnabled": True, "tlsCaPath": str(pki / "ca"), "tlsCaFile": ["ca.pem"],
            "tlsCert": str(pki / "certs/server.pem"), "tlsPk": str(pki / "keys/server.key.pem"),
            "tlsCrlPath": str(pki / "crl"), "tlsCrlFiles": ["ca.crl.pem"],
            "managementTlsCert": str(pki / "certs/management.pem"),
            "managementTlsPk": str(pki / "keys/management.key.pem"), "managementTlsCaFile": [],
            "metricsTlsCaFile": ["metrics-ca.pem"], "metricsTlsCrlFiles": []})
        return ServerProcess(cfg, tmp / "server.log", verify=str(pki / "ca/ca.pem"), cert=client(pki, "client"))
    return shared_server("tls-planes", request, make)


def peer_cn(port: int, pki: Path) -> str:
    ctx = ssl.create_default_context(cafile=str(pki / "ca/ca.pem"))
    ctx.load_cert_chain(*client(pki, "client"))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with ctx.wrap_socket(sock, server_hostname="localhost") as s:
            subject = dict(field[0] for field in s.getpeercert()["subject"])
    return subject["commonName"]


def test_each_plane_serves_its_own_certificate_and_client_rule(planes_srv, pki):
    cfg, ca = planes_srv.cfg, str(pki / "ca/ca.pem")
    assert peer_cn(cfg["port"], pki) == "localhost"
    assert peer_cn(cfg["managementPort"], pki) == "management plane"
    # business: dev CA clients only, revocation honoured
    assert tls_alert(cfg["port"], pki, None) == "TLSV13_ALERT_CERTIFICATE_REQUIRED"
    assert tls_alert(cfg["port"], pki, "revoked") == "SSLV3_ALERT_CERTIFICATE_REVOKED"
    assert planes_srv.post("/", {"inputs": "hello", "parameters": {"max_new_tokens": 2}}).status_code == 200
    # management: no client certificate needed
    r = requests.get(planes_srv.url("management") + "/v2/health/ready", verify=ca, timeout=10)
    assert r.status_code == 200
    # metrics: the other CA's clients only; the dev CA's client is refused at the handshake
    assert tls_alert(cfg["metricsPort"], pki, "client") == "TLSV1_ALERT_UNKNOWN_CA"
    r = requests.get(planes_srv.url("metrics") + "/metrics", verify=ca, cert=client(pki, "scraper"), timeout=10)
    assert r.status_code == 200 and 'request_success_total{model_name="tiny"} 1.0' in r.text


# -- Mozilla's "modern" profile, checked by sslyze against each TLS mode of the live server ---------------
@pytest.fixture(scope="session")
def server_only_tls_srv(request, tiny_model, pki):
    """HTTPS with no client certificate asked (an empty tlsCaFile)."""
    def make(tmp: Path) -> ServerProcess:
        cfg = write_config(tmp / "config.json", tiny_model, server={
            "httpsEnabled": True, "tlsCaPath": str(pki / "ca"), "tlsCaFile": [],
            "tlsCert": str(pki / "certs/server.pem"), "tlsPk": str(pki / "keys/server.key.pem")})
        return ServerProcess(cfg, tmp / "server.log", verify=str(pki / "ca/ca.pem"))
    return shared_server("tls-server-only", request, make)


def sslyze_scan(port: int, pki: Path, client_cert: bool):
    """sslyze's scan of what Mozilla's checker reads (protocols, suites, groups, certificate, known attacks),
    the dev CA as its trust store, with the dev client's certificate where the server asks for one."""
    from sslyze import (ClientAuthenticationCredentials, Scanner, ScanCommandsExtraArguments,
                        ServerNetworkConfiguration, ServerNetworkLocation, ServerScanRequest)
    from sslyze.mozilla_tls_profile.tls_config_checker import SCAN_COMMANDS_NEEDED_BY_MOZILLA_CHECKER
    from sslyze.plugins.certificate_info.implementation import CertificateInfoExtraArgument

    creds = ClientAuthenticationCredentials(certificate_chain_path=pki / "certs/client.pem",
                                            key_path=pki / "keys/client.key.pem") if client_cert else None
    scanner = Scanner()
    scanner.queue_scans([ServerScanRequest(
        server_location=ServerNetworkLocation("localhost", port, ip_address="127.0.0.1"),
        network_configuration=ServerNetworkConfiguration("localhost", tls_client_auth_credentials=creds),
        scan_commands=SCAN_COMMANDS_NEEDED_BY_MOZILLA_CHECKER,
        scan_commands_extra_arguments=ScanCommandsExtraArguments(
            certificate_info=CertificateInfoExtraArgument(custom_ca_file=pki / "ca/ca.pem")))])
    (result,) = scanner.get_results()
    return result


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["tls", "mutual-tls"])
def test_each_tls_mode_passes_sslyzes_mozilla_modern_check(request, pki, mode):
    from sslyze.mozilla_tls_profile.tls_config_checker import (MozillaTlsConfiguration, TlsConfigurationEnum,
                                                               check_server_against_tls_configuration)

    srv = request.getfixturevalue("tls_srv" if mode == "mutual-tls" else "server_only_tls_srv")
    result = sslyze_scan(srv.cfg["port"], pki, client_cert=mode == "mutual-tls")
    # raises ServerNotCompliantWithTlsConfiguration naming each issue (groups, lifetime, key type, ...)
    check_server_against_tls_configuration(result, MozillaTlsConfiguration.get(TlsConfigurationEnum.MOZILLA_MODERN))
    groups = {c.name for c in result.scan_result.elliptic_curves.result.supported_curves}
    assert groups == {"X25519", "secp256r1", "secp384r1"}
    (deployment,) = result.scan_result.certificate_info.result.certificate_deployments
    assert len(deployment.received_certificate_chain) == 1  # the server's own certificate: no anchor, no CA
    assert not deployment.received_chain_contains_anchor_certificate

"""TLS as Mozilla's "modern" profile, in process: `gen-certs` writes ECDSA P-256 certificates (SHA-256) that live
at most 90 days, CA included; a server context accepts the key exchange on X25519, P-256 and P-384 only (a client
offering only X448, P-521 or ffdhe2048 fails its handshake); with mutual TLS the server sends its own certificate,
never the CA it verifies clients with; start-up logs when the certificate expires (a WARNING within 14 days).
tests/integration/test_server_tls.py runs sslyze's modern check against the live server's two TLS modes."""
from __future__ import annotations

import datetime as dt
import logging
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sslyze import (Scanner, ScanCommand, ServerNetworkConfiguration, ServerNetworkLocation, ServerScanRequest,
                    ClientAuthenticationCredentials)

from mindie_service.config import TlsSettings
from mindie_service.devkit import certs
from mindie_service.server import tls
from mindie_service.server.openssl_ctx import set_groups

ACCEPTED, REFUSED = ("X25519", "P-256", "P-384"), ("X448", "P-521", "ffdhe2048")


@pytest.fixture(scope="module")
def sec(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("modern") / "security"
    certs.generate_dev_certs(str(out))
    return out


def _settings(sec: Path, mutual: bool, **kw: object) -> TlsSettings:
    base = dict(ca_path=str(sec / "ca"), ca_files=(str(sec / "ca/ca.pem"),) if mutual else (),
                cert=str(sec / "certs/server.pem"), pk=str(sec / "keys/server.key.pem"), pk_pwd=None, crl_path=None,
                crl_files=())
    base.update(kw)
    return TlsSettings(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["ca/ca.pem", "certs/server.pem", "certs/client.pem"])
def test_gen_certs_writes_ecdsa_p256_certificates_of_at_most_90_days(sec, name):
    cert = x509.load_pem_x509_certificate((sec / name).read_bytes())
    key = cert.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
    assert cert.signature_algorithm_oid == x509.SignatureAlgorithmOID.ECDSA_WITH_SHA256
    assert cert.not_valid_after_utc - cert.not_valid_before_utc <= dt.timedelta(days=90)
    assert cert.not_valid_before_utc <= dt.datetime.now(dt.timezone.utc)


def _tls_server(ctx: ssl.SSLContext) -> Iterator[int]:
    """Accepts TLS connections in a thread and answers each a line; its port."""
    ls = socket.create_server(("127.0.0.1", 0))
    ls.settimeout(0.1)  # accept wakes up to see ``stop``
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                conn, _ = ls.accept()
            except TimeoutError:
                continue
            conn.settimeout(10)
            try:
                with ctx.wrap_socket(conn, server_side=True) as s:
                    s.recv(16)
                    s.sendall(b"hello\n")
            except (OSError, ssl.SSLError):
                pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield ls.getsockname()[1]
    stop.set()
    thread.join(5)
    ls.close()


@pytest.fixture(params=[False, True], ids=["tls", "mutual-tls"], scope="module")
def server(request, sec) -> Iterator[tuple[int, bool]]:
    for port in _tls_server(tls.build_ssl_context(_settings(sec, request.param))):
        yield port, request.param


def _handshake(sec: Path, port: int, mutual: bool, group: str) -> str:
    """"" when a client offering only ``group`` is answered, else the TLS error's reason."""
    ctx = ssl.create_default_context(cafile=str(sec / "ca/ca.pem"))
    if mutual:
        ctx.load_cert_chain(str(sec / "certs/client.pem"), str(sec / "keys/client.key.pem"))
    set_groups(ctx, (group,))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            with ctx.wrap_socket(sock, server_hostname="localhost") as s:
                s.sendall(b"hi\n")
                return "" if s.recv(16) == b"hello\n" else "no answer"
    except ssl.SSLError as e:
        return str(e.reason)


@pytest.mark.parametrize("group", ACCEPTED + REFUSED)
def test_the_key_exchange_takes_the_modern_groups_only(sec, server, group):
    port, mutual = server
    assert _handshake(sec, port, mutual, group) == ("" if group in ACCEPTED else "SSLV3_ALERT_HANDSHAKE_FAILURE")


def test_the_server_sends_its_certificate_and_never_the_ca(sec, server):
    """sslyze reads the chain as received (Python's own client shows only the verified one before 3.13)."""
    port, mutual = server
    creds = ClientAuthenticationCredentials(certificate_chain_path=sec / "certs/client.pem",
                                            key_path=sec / "keys/client.key.pem") if mutual else None
    scanner = Scanner()
    scanner.queue_scans([ServerScanRequest(
        server_location=ServerNetworkLocation("localhost", port, ip_address="127.0.0.1"),
        network_configuration=ServerNetworkConfiguration("localhost", tls_client_auth_credentials=creds),
        scan_commands={ScanCommand.CERTIFICATE_INFO})])
    (result,) = scanner.get_results()
    deployment = result.scan_result.certificate_info.result.certificate_deployments[0]
    chain = [c.subject.rfc4514_string() for c in deployment.received_certificate_chain]
    assert chain == ["CN=localhost,O=mindie-service dev"]
    assert not deployment.received_chain_contains_anchor_certificate


def _cert_for(sec: Path, tmp_path: Path, days: int) -> tuple[str, str]:
    ca = certs.Issued(x509.load_pem_x509_certificate((sec / "ca/ca.pem").read_bytes()),
                      serialization.load_pem_private_key((sec / "ca/ca.key.pem").read_bytes(), None))
    leaf = certs.issue(ca, "localhost", server=True, hosts=("localhost",), days=days)
    certs.write_cert(tmp_path / "leaf.pem", leaf.cert)
    certs.write_key(tmp_path / "leaf.key.pem", leaf.key)
    return str(tmp_path / "leaf.pem"), str(tmp_path / "leaf.key.pem")


@pytest.mark.parametrize("days,level", [(10, logging.WARNING), (60, logging.INFO)])
def test_start_up_says_when_the_certificate_expires(sec, tmp_path, caplog, days, level):
    cert, key = _cert_for(sec, tmp_path, days)
    with caplog.at_level(logging.INFO, logger=tls.__name__):
        tls.build_ssl_context(_settings(sec, False, cert=cert, pk=key))
    (rec,) = [r for r in caplog.records if "ServerConfig.tlsCert" in r.getMessage()]
    assert rec.levelno == level and "expires on" in rec.getMessage()
    assert ("gen-certs" in rec.getMessage()) == (level == logging.WARNING)


def test_a_chain_file_holding_the_ca_is_warned_about(sec, tmp_path, caplog):
    chain = tmp_path / "chain.pem"
    chain.write_bytes((sec / "certs/server.pem").read_bytes() + (sec / "ca/ca.pem").read_bytes())
    with caplog.at_level(logging.WARNING, logger=tls.__name__):
        tls.build_ssl_context(_settings(sec, True, cert=str(chain)))
    assert any("self-signed CA certificate" in r.getMessage() for r in caplog.records)


def test_an_expired_certificate_stops_start_up_saying_how_to_renew_it(sec, tmp_path):
    from mindie_service.errors import ConfigError

    cert, key = _cert_for(sec, tmp_path, 0)  # not after: five minutes ago
    with pytest.raises(ConfigError, match=r"ServerConfig.tlsCert: .* expired on .*gen-certs --out DIR --force"):
        tls.build_ssl_context(_settings(sec, False, cert=cert, pk=key))


def test_without_libssl_the_key_exchange_is_p256_only_and_says_so(sec, monkeypatch, caplog):
    """A Python whose SSLContext does not lead to libssl's SSL_CTX: set_ecdh_curve's one curve, P-256 (inside the
    profile), and a WARNING saying what is lost."""
    from mindie_service.server.openssl_ctx import OpenSSLUnavailable

    def unavailable(*_: object) -> None:
        raise OpenSSLUnavailable("no libssl here")

    monkeypatch.setattr(tls, "set_groups", unavailable)
    with caplog.at_level(logging.WARNING, logger=tls.__name__):
        ctx = tls.build_ssl_context(_settings(sec, False))
    assert any("P-256 only" in r.getMessage() for r in caplog.records)
    for port in _tls_server(ctx):
        assert [_handshake(sec, port, False, g) == "" for g in ("P-256", "X25519", "X448")] == [True, False, False]

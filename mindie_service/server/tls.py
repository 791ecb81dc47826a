"""TLS for the listeners, as Mozilla's "modern" profile: TLS 1.3 only, the key exchange on X25519, P-256 or P-384
only, no trust anchor sent in the chain; mutual TLS when CA files are set, CRLs honoured.

Everything is read once, at start-up. A file that is missing, unreadable or unusable stops
start-up with a ConfigError naming the config key (``ServerConfig.tlsCert`` ...). MindIE's rules
are enforced: X509v3 certificates, not expired, RSA keys of at least 3072 bits, certificate and
key matching, CRLs not expired. When each certificate expires is logged (a WARNING within 14 days).
"""
from __future__ import annotations

import datetime as dt
import logging
import os
import ssl
import tempfile

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from mindie_service.config import ServerSettings, TlsSettings
from mindie_service.errors import ConfigError
from mindie_service.server.openssl_ctx import OpenSSLUnavailable, send_no_anchor, set_groups

logger = logging.getLogger(__name__)

MIN_RSA_BITS = 3072
# Mozilla's modern profile (its tls_curves); OpenSSL's default list adds X448, P-521 and the ffdhe groups.
MODERN_GROUPS = ("X25519", "P-256", "P-384")
EXPIRY_WARNING = dt.timedelta(days=14)
_S = "ServerConfig"
_RENEW = "development certificates: `mindie-service gen-certs --out DIR --force` writes a new set"


def _read(key: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"{_S}.{key}: cannot read {path}: {e.strerror or e}") from None


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _load_certs(key: str, path: str) -> list[x509.Certificate]:
    data = _read(key, path)
    try:
        certs = x509.load_pem_x509_certificates(data) if b"-----BEGIN" in data else [x509.load_der_x509_certificate(data)]
    except ValueError as e:
        raise ConfigError(f"{_S}.{key}: {path} is not a certificate: {e}") from None
    for c in certs:
        if c.version != x509.Version.v3:
            raise ConfigError(f"{_S}.{key}: {path} must be an X509v3 certificate, got {c.version.name}")
        if c.not_valid_after_utc < _now():
            raise ConfigError(f"{_S}.{key}: {path} expired on {c.not_valid_after_utc.isoformat()} ({_RENEW})")
    return certs


def log_expiry(key: str, path: str, certs: list[x509.Certificate]) -> None:
    """When the first of ``certs`` to expire does: INFO, or WARNING within EXPIRY_WARNING."""
    end = min(c.not_valid_after_utc for c in certs)
    left = end - _now()
    if left < EXPIRY_WARNING:
        logger.warning("%s.%s: %s expires on %s, in %.1f days (%s)", _S, key, path, end.strftime("%Y-%m-%d %H:%M UTC"),
                       left.total_seconds() / 86400, _RENEW)
    else:
        logger.info("%s.%s: %s expires on %s (in %d days)", _S, key, path, end.strftime("%Y-%m-%d"),
                    round(left.total_seconds() / 86400))


def _warn_anchor(key: str, path: str, certs: list[x509.Certificate]) -> None:
    """A self-signed certificate after the server's own is a trust anchor: it is sent as the file holds it."""
    if any(c.issuer == c.subject for c in certs[1:]):
        logger.warning("%s.%s: %s holds a self-signed CA certificate after the server's: it is sent to every client "
                       "(a trust anchor, which clients must hold themselves); keep the server's certificate and its "
                       "intermediates only", _S, key, path)


def _modern_profile(ctx: ssl.SSLContext) -> None:
    """The groups of the modern profile, and the certificate file's chain sent as it is (no CA from the verify
    store). Where libssl cannot be reached (another Python build), P-256 alone and a WARNING."""
    try:
        set_groups(ctx, MODERN_GROUPS)
        send_no_anchor(ctx)
    except OpenSSLUnavailable as e:
        ctx.set_ecdh_curve("prime256v1")
        logger.warning("TLS: %s; the key exchange is P-256 only, and with client certificates the CA may be sent "
                       "in the server's chain", e)


def _check_rsa(key: str, path: str, public_key: object) -> None:
    if isinstance(public_key, rsa.RSAPublicKey) and public_key.key_size < MIN_RSA_BITS:
        raise ConfigError(f"{_S}.{key}: {path} holds an RSA key of {public_key.key_size} bits; "
                          f"at least {MIN_RSA_BITS} are required")


def _crl_pem(key: str, path: str) -> bytes:
    data = _read(key, path)
    try:
        crl = x509.load_pem_x509_crl(data) if b"-----BEGIN" in data else x509.load_der_x509_crl(data)
    except ValueError as e:
        raise ConfigError(f"{_S}.{key}: {path} is not a certificate revocation list: {e}") from None
    if crl.next_update_utc is not None and crl.next_update_utc < _now():
        raise ConfigError(f"{_S}.{key}: {path} expired on {crl.next_update_utc.isoformat()} (nextUpdate)")
    return crl.public_bytes(serialization.Encoding.PEM)


def _verify_clients(ctx: ssl.SSLContext, tls: TlsSettings, ca_key: str, crl_key: str) -> None:
    """Client certificates required against the CA files, with their CRLs, when CA files are set."""
    if tls.ca_files:
        for path in tls.ca_files:
            log_expiry(ca_key, path, _load_certs(ca_key, path))
            try:
                ctx.load_verify_locations(cafile=path)
            except ssl.SSLError as e:
                raise ConfigError(f"{_S}.{ca_key}: {path}: {e}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
        if tls.crl_files:
            for path in tls.crl_files:
                pem = _crl_pem(crl_key, path)
                # load_verify_locations reads CRLs from a PEM file only (cadata takes certificates).
                fd, tmp = tempfile.mkstemp(suffix=".crl.pem")
                try:
                    with os.fdopen(fd, "wb") as f:
                        f.write(pem)
                    ctx.load_verify_locations(cafile=tmp)
                finally:
                    os.unlink(tmp)
            ctx.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    elif tls.crl_files:
        logger.warning("%s.%s is set but no CA file (%s.%s): client certificates are not requested, CRLs unused",
                       _S, crl_key, _S, ca_key)


def build_ssl_context(tls: TlsSettings, prefix: str = "tls") -> ssl.SSLContext:
    """A server SSLContext from one plane's settings; ``prefix`` names the plane's keys in messages
    (``tls``, ``managementTls``, ``metricsTls``)."""
    cert_key, pk_key, pwd_key = f"{prefix}Cert", f"{prefix}Pk", f"{prefix}PkPwd"
    ca_key, crl_key = f"{prefix}CaFile", f"{prefix}CrlFiles"

    certs = _load_certs(cert_key, tls.cert)
    _check_rsa(cert_key, tls.cert, certs[0].public_key())
    log_expiry(cert_key, tls.cert, certs[:1])
    _warn_anchor(cert_key, tls.cert, certs)
    password: bytes | None = None
    if tls.pk_pwd:
        password = _read(pwd_key, tls.pk_pwd).rstrip(b"\r\n")
        if not password:
            raise ConfigError(f"{_S}.{pwd_key}: {tls.pk_pwd} is empty")
    pk_data = _read(pk_key, tls.pk)
    try:
        private_key = serialization.load_pem_private_key(pk_data, password=password)
    except TypeError as e:  # password given for an unencrypted key, or missing for an encrypted one
        raise ConfigError(f"{_S}.{pk_key}: {tls.pk}: {e} (see {_S}.{pwd_key})") from None
    except ValueError as e:
        raise ConfigError(f"{_S}.{pk_key}: cannot load the private key {tls.pk} (wrong {_S}.{pwd_key}?): {e}") from None
    if private_key.public_key().public_bytes(serialization.Encoding.DER,
                                             serialization.PublicFormat.SubjectPublicKeyInfo) != \
            certs[0].public_key().public_bytes(serialization.Encoding.DER,
                                               serialization.PublicFormat.SubjectPublicKeyInfo):
        raise ConfigError(f"{_S}.{pk_key}: {tls.pk} does not match the certificate {tls.cert} ({_S}.{cert_key})")

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.options |= ssl.OP_NO_COMPRESSION
    _modern_profile(ctx)
    try:
        ctx.load_cert_chain(tls.cert, tls.pk, password=password)
    except ssl.SSLError as e:
        raise ConfigError(f"{_S}.{cert_key}/{pk_key}: {tls.cert}, {tls.pk}: {e}") from None

    _verify_clients(ctx, tls, ca_key, crl_key)
    return ctx


def plane_contexts(server: ServerSettings) -> dict[str, ssl.SSLContext]:
    """One SSLContext per plane (business, management, metrics); planes with the same settings share one."""
    settings = {"business": ("tls", server.tls), "management": ("managementTls", server.management_tls),
                "metrics": ("metricsTls", server.metrics_tls)}
    built: dict[TlsSettings, ssl.SSLContext] = {}
    out: dict[str, ssl.SSLContext] = {}
    for plane, (prefix, tls) in settings.items():
        if tls not in built:
            built[tls] = build_ssl_context(tls, prefix)
        out[plane] = built[tls]
    return out

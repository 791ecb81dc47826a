"""Development certificates: a local CA, a server certificate for localhost / 127.0.0.1 / ::1 and a
client certificate, X509v3 (``mindie-service gen-certs``), as Mozilla's "modern" TLS profile asks: ECDSA keys on
P-256 signed with SHA-256, and no certificate, the CA included, valid for more than 90 days (the server logs when
its certificate expires; ``gen-certs --force`` writes a new set).

Layout under ``out_dir`` (what conf/config.json names)::

    ca/ca.pem  ca/ca.key.pem  certs/server.pem  keys/server.key.pem  certs/client.pem  keys/client.key.pem

For development only: keys are written unencrypted (mode 0600).
"""
from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mindie_service.errors import ExistingFilesError

logger = logging.getLogger(__name__)

MAX_DAYS = 90  # Mozilla's modern profile: certificates live at most 90 days
DEV_FILES = ("ca/ca.pem", "ca/ca.key.pem", "certs/server.pem", "keys/server.key.pem",
             "certs/client.pem", "keys/client.key.pem")


PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclass
class Issued:
    cert: x509.Certificate
    key: PrivateKey


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "mindie-service dev"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def new_key() -> ec.EllipticCurvePrivateKey:
    """An ECDSA key on P-256 (secp256r1), the modern profile's certificate key."""
    return ec.generate_private_key(ec.SECP256R1())


def rsa_key(bits: int) -> rsa.RSAPrivateKey:
    """An RSA key, for material the server must judge by MindIE's RSA rule (at least 3072 bits)."""
    return rsa.generate_private_key(public_exponent=65537, key_size=bits)


def _validity(days: int) -> tuple[dt.datetime, dt.datetime]:
    """Not before five minutes ago (clocks a little behind), not after ``days`` from then: the whole lifetime
    is ``days``, which Mozilla's profile measures (notAfter - notBefore)."""
    start = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    return start, start + dt.timedelta(days=days)


def make_ca(cn: str = "mindie-service dev CA", days: int = MAX_DAYS, key: PrivateKey | None = None) -> Issued:
    key = key or new_key()
    start, end = _validity(days)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return Issued(cert, key)


def issue(ca: Issued, cn: str, *, server: bool, hosts: tuple[str, ...] = (), days: int = MAX_DAYS,
          key: PrivateKey | None = None) -> Issued:
    """A leaf certificate signed by ``ca`` for a server (SANs from ``hosts``) or a client."""
    key = key or new_key()
    start, end = _validity(days)
    b = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca.cert.subject).public_key(key.public_key())
         .serial_number(x509.random_serial_number())
         .not_valid_before(start).not_valid_after(end)
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         # key encipherment is RSA key transport, which an ECDSA key (and TLS 1.3) never does
         .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False,
                                      key_encipherment=isinstance(key, rsa.RSAPrivateKey),
                                      crl_sign=False, content_commitment=False, data_encipherment=False,
                                      key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
         .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                               else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False))
    if hosts:
        sans: list[x509.GeneralName] = []
        for h in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                sans.append(x509.DNSName(h))
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return Issued(b.sign(ca.key, hashes.SHA256()), key)


def make_crl(ca: Issued, revoked: list[x509.Certificate], days: int = 30) -> x509.CertificateRevocationList:
    now = dt.datetime.now(dt.timezone.utc)
    b = (x509.CertificateRevocationListBuilder().issuer_name(ca.cert.subject)
         .last_update(now - dt.timedelta(minutes=5)).next_update(now + dt.timedelta(days=days)))
    for c in revoked:
        b = b.add_revoked_certificate(x509.RevokedCertificateBuilder().serial_number(c.serial_number)
                                      .revocation_date(now - dt.timedelta(minutes=1)).build())
    return b.sign(ca.key, hashes.SHA256())


def write_cert(path: str | Path, cert: x509.Certificate) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def write_key(path: str | Path, key: PrivateKey, password: bytes | None = None) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    enc: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption())
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(p, 0o600)


def write_crl(path: str | Path, crl: x509.CertificateRevocationList) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(crl.public_bytes(serialization.Encoding.PEM))


def generate_dev_certs(out_dir: str, if_missing: bool = False, force: bool = False) -> bool:
    """Write a development CA, server and client certificates under ``out_dir``; returns True when files were
    written. A file of the layout already there: with ``if_missing`` nothing is written (all kept, or, when only
    some are there, none added beside them), with ``force`` all are replaced, else ExistingFilesError (a new CA
    would break the clients of a server using the old one)."""
    out = Path(out_dir)
    present = [f for f in DEV_FILES if os.path.lexists(out / f)]
    if present and if_missing:
        if len(present) == len(DEV_FILES):
            logger.info("development certificates already in %s", out)
        else:
            logger.warning("%s holds %s but not the whole gen-certs layout; writing none beside them "
                           "(`mindie-service gen-certs --out %s --force` writes a new set)",
                           out, ", ".join(present), out)
        return False
    if present and not force:
        raise ExistingFilesError(f"{out} already holds certificates ({', '.join(present)}); a new CA would break the "
                                 "clients of a server using them: pass --force to replace them")
    ca = make_ca()
    server = issue(ca, "localhost", server=True, hosts=("localhost", "127.0.0.1", "::1"))
    client = issue(ca, "mindie-service dev client", server=False)
    write_cert(out / "ca/ca.pem", ca.cert)
    write_key(out / "ca/ca.key.pem", ca.key)
    write_cert(out / "certs/server.pem", server.cert)
    write_key(out / "keys/server.key.pem", server.key)
    write_cert(out / "certs/client.pem", client.cert)
    write_key(out / "keys/client.key.pem", client.key)
    logger.info("wrote development certificates (ECDSA P-256) to %s, valid until %s", out,
                server.cert.not_valid_after_utc.strftime("%Y-%m-%d %H:%M UTC"))
    return True

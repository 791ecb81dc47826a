"""API keys (issue 28): config lists kept only as hashes, a key file of hashes, constant-time checks per plane,
the admin plane, and no key ever repeated in an error."""
from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from mindie_service.config import load_config
from mindie_service.errors import ConfigError, ForbiddenError, UnauthorizedError
from mindie_service.server.auth import ADMIN, Auth, read_key_file
from tests.server_utils import write_mock_config

KEY = "s3cret-key-000111"


def _cfg(tmp_path: Path, **server) -> Path:
    return write_mock_config(tmp_path, **server)


def test_config_keeps_only_the_hashes(tmp_path):
    cfg = load_config(_cfg(tmp_path, businessApiKeys=[KEY], managementApiKeys=["admin-key-0001"]))
    assert ("business", hashlib.sha256(KEY.encode()).hexdigest()) in cfg.server.api_key_hashes
    assert KEY not in repr(cfg.server)


def test_a_bad_key_is_refused_without_being_quoted(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(_cfg(tmp_path, businessApiKeys=["has a space in it"]))
    assert "businessApiKeys[0]" in str(err.value) and "has a space" not in str(err.value)


def test_business_port_admin_routes_need_an_admin_key(tmp_path):
    with pytest.raises(ConfigError, match="managementRoutesOnBusinessPort needs an admin key"):
        load_config(_cfg(tmp_path, managementRoutesOnBusinessPort=True))
    load_config(_cfg(tmp_path, managementRoutesOnBusinessPort=True, managementApiKeys=["admin-key-0001"]))


def test_key_file_lines_and_errors(tmp_path):
    f = tmp_path / "keys"
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    f.write_text(f"# comment\n\nmetrics sha256:{digest.upper()}  # trailing\n")
    assert read_key_file(str(f)) == [("metrics", digest)]
    f.write_text(f"metrics {KEY}\n")
    with pytest.raises(ConfigError, match=r"keys:1: expected") as err:
        read_key_file(str(f))
    assert KEY not in str(err.value)


def test_checks_per_plane(tmp_path):
    f = tmp_path / "keys"
    f.write_text(f"management sha256:{hashlib.sha256(b'admin-from-file').hexdigest()}\n")
    settings = SimpleNamespace(api_key_hashes=(("business", hashlib.sha256(KEY.encode()).hexdigest()),),
                               api_key_file=str(f), management_port=1026)
    auth = Auth(settings)
    assert auth.check("business", "/generate", f"Bearer {KEY}") is None
    assert auth.check("business", "/generate", f"bearer  {KEY} ") is None
    assert isinstance(auth.check("business", "/generate", None), UnauthorizedError)
    assert isinstance(auth.check("business", "/generate", f"Basic {KEY}"), UnauthorizedError)
    assert isinstance(auth.check("management", "/v1/status", f"Bearer {KEY}"), UnauthorizedError)
    assert auth.check("management", "/v1/status", "Bearer admin-from-file") is None
    assert auth.check(ADMIN, "/stopService", "Bearer admin-from-file") is None
    assert auth.check("business", "/health", None) is None and auth.check("metrics", "/metrics", None) is None
    f.write_text("")
    auth.reload()
    assert isinstance(auth.check(ADMIN, "/stopService", "Bearer admin-from-file"), ForbiddenError)  # no admin key
    f.write_text("garbage\n")
    auth.reload()  # a bad file keeps the keys in force
    assert auth.check("business", "/generate", f"Bearer {KEY}") is None

"""Issue #16, item 4 (configuration side): maxConnections follows maxLinkNum by default, and start-up raises
the soft open-files limit to hold it, or refuses the config when the hard limit cannot."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mindie_service.config import load_config
from mindie_service.errors import ConfigError
from mindie_service.server import listener

ROOT = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, **server) -> Path:
    cfg = json.loads((ROOT / "conf" / "config.json").read_text())
    cfg["ServerConfig"].update(server)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def test_new_keys_have_their_documented_defaults(tmp_path):
    s = load_config(str(_config(tmp_path, maxLinkNum=10))).server
    assert s.max_connections == 3 * 10 + 256
    assert s.body_timeout == 30 and s.max_decoded_media_bytes == 256 * 1024 * 1024
    assert load_config(str(_config(tmp_path, maxConnections=50))).server.max_connections == 50
    with pytest.raises(ConfigError, match="bodyTimeoutSeconds"):
        load_config(str(_config(tmp_path, bodyTimeoutSeconds=0)))


class FakeResource:
    RLIMIT_NOFILE, RLIM_INFINITY = 7, -1

    def __init__(self, soft: int, hard: int) -> None:
        self.limits, self.set_to = (soft, hard), None

    def getrlimit(self, which: int) -> tuple[int, int]:
        return self.limits

    def setrlimit(self, which: int, value: tuple[int, int]) -> None:
        self.set_to = value


def test_open_files_limit_is_raised_to_fit_or_the_config_refused(monkeypatch):
    import sys
    fake = FakeResource(1024, 20000)
    monkeypatch.setitem(sys.modules, "resource", fake)
    assert listener.raise_open_files_limit(3000) == 3000 + listener.FD_MARGIN
    assert fake.set_to == (3000 + listener.FD_MARGIN, 20000)
    monkeypatch.setitem(sys.modules, "resource", FakeResource(1024, 2048))
    with pytest.raises(ConfigError, match="maxConnections"):
        listener.raise_open_files_limit(3000)


def test_refusals_log_once_per_interval(caplog):
    log = listener.RefusalLog(interval=3600)
    with caplog.at_level("WARNING", logger=listener.__name__):
        for _ in range(1000):
            log.refused(10)
    assert log.count == 1000
    assert len([r for r in caplog.records if "maxConnections" in r.getMessage()]) == 1

"""`serve --prepare` (what `make serve` runs): builds a missing demo model, rebuilds one an older devkit
built, and never touches a real checkpoint."""
from __future__ import annotations

import json
from pathlib import Path

from mindie_service.config import load_config
from mindie_service.devkit.presets import MARKER, build_demo_model, is_current
from mindie_service.serve_wiring import prepare_assets
from tests.server_utils import write_config


def _marker(folder: Path) -> dict:
    return json.loads((folder / MARKER).read_text())


def test_prepare_builds_a_missing_demo_model_and_rebuilds_a_stale_one(tmp_path: Path) -> None:
    folder = tmp_path / "models" / "tiny"
    cfg = load_config(write_config(tmp_path / "config.json", folder))
    prepare_assets(cfg)
    assert is_current(folder)
    body = _marker(folder)
    body["devkit_version"] = "0.stale"
    (folder / MARKER).write_text(json.dumps(body))
    assert not is_current(folder)
    prepare_assets(cfg)
    assert is_current(folder)


def test_prepare_leaves_a_checkpoint_without_devkit_marker_alone(tmp_path: Path) -> None:
    folder = tmp_path / "models" / "tiny"
    build_demo_model("tiny", str(folder))
    (folder / MARKER).unlink()  # as a real Hugging Face checkpoint: no marker
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    prepare_assets(load_config(write_config(tmp_path / "config.json", folder)))
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before

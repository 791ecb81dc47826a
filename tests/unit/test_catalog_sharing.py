"""DELETE /v1/models/{id} removes a folder only when nothing else uses any of its files (issue 28): not a
ModelConfig's folder under another name, not a folder another model links into, not one linking into another."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from mindie_service.catalog.catalog import Catalog
from mindie_service.errors import ConflictError


def _model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


def _catalog(root: Path, weight_path: Path) -> Catalog:
    cfg = SimpleNamespace(models=[SimpleNamespace(name="demo-tiny", weight_path=str(weight_path), mock=True,
                                                generation_config="vllm")],
                          lora_modules=())
    return Catalog(cfg, root, build=None)


def test_a_configured_models_folder_is_not_deleted_under_its_folder_name(tmp_path):
    root = tmp_path / "models"
    tiny = _model(root / "tiny")
    cat = _catalog(root, tiny)
    with pytest.raises(ConflictError, match="ModelConfig entry demo-tiny"):
        cat.delete("tiny")
    assert (tiny / "model.safetensors").is_file() and "tiny" in cat.entries


def test_files_shared_through_links_are_not_deleted(tmp_path):
    root = tmp_path / "models"
    _model(root / "a")
    b = root / "b"
    b.mkdir()
    (b / "config.json").write_text("{}")
    (b / "model.safetensors").symlink_to(root / "a" / "model.safetensors")
    cat = _catalog(root, _model(tmp_path / "elsewhere"))
    with pytest.raises(ConflictError, match="catalog model b"):
        cat.delete("a")
    with pytest.raises(ConflictError, match="catalog model a"):
        cat.delete("b")
    (b / "model.safetensors").unlink()
    cat.delete("b")  # nothing shared any more
    assert not b.exists() and (root / "a" / "model.safetensors").is_file()

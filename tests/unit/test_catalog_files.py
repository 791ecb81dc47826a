"""Catalog pieces without a server: model.json (Jan's Model shape) and what it means for serving, model ids,
the memory estimate, and archive extraction (no entry may leave the folder; size cap)."""
from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from mindie_service.catalog.download import checkpoint_root, extract
from mindie_service.catalog.fit_estimate import estimate
from mindie_service.catalog.model_json import ModelRecord, check_model_id, read_model_json
from mindie_service.errors import MediaError, ValidationError


def test_model_json_meaning(tmp_path: Path) -> None:
    (tmp_path / "model.json").write_text('{"name": "N", "parameters": {"temperature": "0.7", "top_p": "1", '
                                         '"top_k": "0", "token_limit": "128"}, "settings": {"ctx_len": "256"}, '
                                         '"engine_parameters": {"user_prompt": "U: "}}')
    rec = read_model_json(tmp_path, "m")
    assert rec is not None and rec.id == "m" and rec.name == "N"
    d = rec.request_defaults()
    assert (d.temperature, d.top_p, d.top_k, d.max_tokens) == (0.7, None, None, 128)  # Jan's "1"/"0" = off
    assert rec.ctx_len() == 256 and rec.prefixes().user == "U: " and rec.prefixes().system == "SYSTEM: "
    assert rec.to_json()["type"] == "model"
    (tmp_path / "model.json").write_text("[1]")
    assert read_model_json(tmp_path, "m") is None  # a broken model.json is ignored, not fatal
    assert ModelRecord(id="x").ctx_len() is None


@pytest.mark.parametrize("bad", ["../x", ".hidden", "a/b", "", "x" * 129, "..", "a b"])
def test_model_ids(bad: str) -> None:
    with pytest.raises(ValidationError):
        check_model_id(bad)
    assert check_model_id("Qwen2.5-7b_q8") == "Qwen2.5-7b_q8"


def test_memory_estimate_counts_float32_weights(tiny_model: Path) -> None:
    est = estimate(tiny_model, max_seq_len=512)
    size = sum(f.stat().st_size for f in tiny_model.glob("*.safetensors"))
    assert 0.9 * size < est.weights <= size and est.kv_min > 0
    assert estimate(tiny_model, 512, world_size=2).weights == est.weights // 2


def _tar(path: Path, entries: list[tarfile.TarInfo]) -> Path:
    with tarfile.open(path, "w:gz") as t:
        for info in entries:
            t.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return path


def _file(name: str, size: int = 1) -> tarfile.TarInfo:
    i = tarfile.TarInfo(name)
    i.size = size
    return i


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    i = tarfile.TarInfo(name)
    i.type, i.linkname = kind, target
    return i


@pytest.mark.parametrize("entry", [_file("../evil"), _file("/abs"), _file("ok/../../evil"),
                                   _link("l", "/etc/passwd"), _link("h", "config.json", tarfile.LNKTYPE)])
def test_tar_entries_that_escape_are_refused(tmp_path: Path, entry: tarfile.TarInfo) -> None:
    arc = _tar(tmp_path / "a.tar.gz", [_file("m/config.json"), entry])
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValidationError, match="would leave"):
        extract(arc, out, 1 << 20)
    assert list(out.iterdir()) == [] and not (tmp_path / "evil").exists()


def test_zip_checks_and_the_cap(tmp_path: Path) -> None:
    arc = tmp_path / "a.zip"
    with zipfile.ZipFile(arc, "w") as z:
        z.writestr("m/config.json", "{}")
        link = zipfile.ZipInfo("m/link")
        link.external_attr = (0o120777 << 16)
        z.writestr(link, "/etc/passwd")
    with pytest.raises(ValidationError, match="would leave"):
        extract(arc, tmp_path, 1 << 20)
    good = _tar(tmp_path / "g.tar.gz", [_file("m/config.json", 10), _file("m/w.safetensors", 100)])
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(MediaError) as e:
        extract(good, out, 50)
    assert e.value.status == 413
    extract(good, out, 1000)
    assert checkpoint_root(out) == out / "m"

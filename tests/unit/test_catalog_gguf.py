"""GGUF models in the catalog without a server: a folder holding one .gguf is a model; model.json's ``format``
(safetensors, gguf, ggufv3; anything else refused naming it); the memory estimate counts a GGUF's tensors at
their loaded (dequantized) size; a downloaded single .gguf is a checkpoint folder."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from mindie_service.catalog.catalog import Catalog
from mindie_service.catalog.checkpoint_kind import check_folder, detect
from mindie_service.catalog.download import checkpoint_root
from mindie_service.catalog.fit_estimate import estimate
from npu_ops import cpu_kernels
from mindie_service.errors import ValidationError
from tests.gguf_files import write_gguf

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def tiny_gguf(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(tiny_model, tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def _folder(root: Path, name: str, gguf_file: Path | None = None, model_json: dict | None = None) -> Path:
    d = root / name
    d.mkdir()
    if gguf_file is not None:
        shutil.copy(gguf_file, d / gguf_file.name)
    if model_json is not None:
        (d / "model.json").write_text(json.dumps(model_json))
    return d


def test_a_folder_holding_one_gguf_is_a_model_and_its_format_is_checked(tmp_path, tiny_gguf):
    root = tmp_path / "models"
    root.mkdir()
    _folder(root, "plain", tiny_gguf)
    _folder(root, "jan", tiny_gguf, {"format": "ggufv3"})
    _folder(root, "onnx", tiny_gguf, {"format": "onnx"})
    _folder(root, "wrong", tiny_gguf, {"format": "safetensors"})
    _folder(root, "empty")
    cat = Catalog(SimpleNamespace(models=[]), root, build=None)
    assert sorted(cat.entries) == ["jan", "onnx", "plain", "wrong"]  # "empty" holds nothing to serve
    assert cat.entries["plain"].state == "downloaded" and cat.entries["plain"].record.format == "gguf"
    assert check_folder("jan", "ggufv3", root / "jan") == "gguf" and check_folder("p", "GGUF", root / "plain") == "gguf"
    with pytest.raises(ValidationError, match="format 'onnx' is not one this service runs"):
        cat.start("onnx")
    with pytest.raises(ValidationError, match="says format 'safetensors' but its folder holds a gguf"):
        cat.start("wrong")
    shutil.copy(tiny_gguf, root / "plain" / "second.gguf")
    with pytest.raises(ValidationError, match="exactly one .gguf file, it holds 2"):
        cat.start("plain")


def test_the_estimate_counts_gguf_tensors_as_loaded(tmp_path, tiny_model, tiny_gguf):
    """The F32 GGUF of tiny estimates as tiny's safetensors does; with Q8_0 tensors an fp32 load keeps them packed
    (the estimate counts their stored bytes), a bf16 or tensor-parallel one dequantizes them (the estimate counts
    them at the configured dtype)."""
    a, b = tmp_path / "f32", tmp_path / "q8"
    a.mkdir()
    b.mkdir()
    shutil.copy(tiny_gguf, a / "m.gguf")
    q8 = {f"blk.{i}.ffn_down.weight": gguf.GGMLQuantizationType.Q8_0 for i in range(4)}
    write_gguf(tiny_model, b / "m.gguf", types=q8)
    assert (b / "m.gguf").stat().st_size < (a / "m.gguf").stat().st_size
    want = estimate(tiny_model, 512)
    assert estimate(a, 512) == want
    stored = 4 * 128 * 352 // 32 * 34  # four Q8_0 down projections [128, 352]: 34 bytes a block of 32
    if cpu_kernels.load() is not None:
        assert estimate(b, 512).weights == want.weights - 4 * 128 * 352 * 4 + stored
    assert estimate(b, 512, float_bytes=2).weights == want.weights // 2
    assert estimate(b, 512, world_size=2) == estimate(a, 512, world_size=2)
    assert estimate(a / "m.gguf", 512) == want  # a ModelConfig may name the file itself
    (b / "m.gguf").write_bytes(b"GGUF" + b"\0" * 7)
    with pytest.raises(ValidationError, match="m.gguf is malformed"):
        estimate(b, 512)


def test_a_downloaded_gguf_is_a_checkpoint_folder(tmp_path, tiny_gguf):
    staged = _folder(tmp_path, "staged", tiny_gguf)
    assert checkpoint_root(staged) == staged and detect(staged) == "gguf"
    nested = tmp_path / "outer"
    nested.mkdir()
    shutil.move(staged, nested / "inner")
    assert checkpoint_root(nested) == nested / "inner"
    with pytest.raises(ValidationError, match="neither config.json"):
        checkpoint_root(_folder(tmp_path, "nothing"))


def test_a_local_gguf_source_is_copied_within_the_cap(tmp_path, tiny_gguf):
    """A local source (already checked to lie in the allowed folders) that is one .gguf file: copied into the
    staging folder, or refused (413) when over the download cap; any other plain file is refused."""
    import asyncio

    from mindie_service.catalog.download import Progress, Source, fetch_into
    from mindie_service.errors import MediaError

    def fetch(src: Path, staging: Path, cap: int) -> None:
        staging.mkdir()
        asyncio.run(fetch_into("m", [], Source(path=src), staging, cap, None, Progress()))  # type: ignore[arg-type]

    fetch(tiny_gguf, tmp_path / "a", 1 << 30)
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["tiny.gguf"] and checkpoint_root(tmp_path / "a")
    with pytest.raises(MediaError, match="over the cap") as exc:
        fetch(tiny_gguf, tmp_path / "b", 1000)
    assert exc.value.status == 413
    other = tmp_path / "notes.txt"
    other.write_text("x")
    with pytest.raises(ValidationError, match="a folder, a .tar/.tar.gz/.zip archive or a .gguf file"):
        fetch(other, tmp_path / "c", 1 << 30)


def test_a_gguf_is_parsed_once_for_weights_config_and_tokenizer(tmp_path, tiny_gguf, monkeypatch):
    """Our reader, transformers' config helper and its tokenizer helper share one parse of the file."""
    from mindie_service.models import gguf_checkpoint

    constructed = []
    real_cls, real_init = gguf.GGUFReader, gguf.GGUFReader.__init__

    def counting_init(self, *args, **kwargs):
        constructed.append(args)
        real_init(self, *args, **kwargs)
    monkeypatch.setattr(real_cls, "__init__", counting_init)
    f = tmp_path / "m.gguf"
    shutil.copy(tiny_gguf, f)
    ckpt = gguf_checkpoint.open_checkpoint(f)
    tok = gguf_checkpoint.load_tokenizer(tmp_path)
    assert ckpt.hf_config.num_hidden_layers > 0 and tok("hello").input_ids
    assert len(constructed) == 1
    assert gguf.GGUFReader is real_cls  # the patch is gone once the helpers return


def test_a_model_not_yet_downloaded_shows_the_format_its_source_names(tmp_path):
    from mindie_service.catalog.checkpoint_kind import expected_kind
    from mindie_service.catalog.entry import CatalogEntry
    from mindie_service.catalog.model_json import ModelRecord
    from mindie_service.server.handlers_models import model_view

    assert expected_kind("https://h/x/model.Q4_K_M.gguf?download=1", []) == "gguf"
    assert expected_kind("https://h/x", ["config.json", "model.safetensors"]) == "safetensors"
    assert expected_kind("https://h/x.tar.gz", []) is None

    def view(record):
        entry = CatalogEntry("m", tmp_path / "absent", record, state="not_downloaded")
        return model_view(entry, detail=False)["format"]
    assert view(ModelRecord(id="m", source_url="https://h/a/b.gguf")) == "gguf"
    assert view(ModelRecord(id="m", source_url="https://h/a", assets=["model.safetensors"])) == "safetensors"
    assert view(ModelRecord(id="m", source_url="https://h/a", format="ggufv3")) == "ggufv3"

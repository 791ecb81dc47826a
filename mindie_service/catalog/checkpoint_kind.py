"""What a catalog folder holds, and whether its ``model.json`` ``format`` is one this service runs.

A folder is a checkpoint when it holds config.json (a Hugging Face folder: safetensors, msModelSlim) or, without
config.json, a ``.gguf`` file (ggml's single-file format, Jan's ``ggufv3``): the same rule as the loader's
(models/gguf_checkpoint.find_gguf), read here without importing the model code."""
from __future__ import annotations

import logging
from pathlib import Path

from mindie_service.errors import ValidationError
from mindie_service.models.demo_marker import gguf_beside_demo

logger = logging.getLogger(__name__)

SAFETENSORS, GGUF = "safetensors", "gguf"
# model.json ``format`` (case-insensitive) -> the checkpoint kind it means; Jan's seed writes "ggufv3".
FORMATS: dict[str, str] = {"safetensors": SAFETENSORS, "gguf": GGUF, "ggufv3": GGUF}


def gguf_files(folder: Path) -> list[Path]:
    """The ``.gguf`` files of ``folder`` (regular files, not links), by name; a ModelConfig entry's
    ``modelWeightPath`` may name the ``.gguf`` file itself."""
    if folder.is_file() and folder.suffix.lower() == ".gguf":
        return [folder]
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.gguf") if p.is_file() and not p.is_symlink())


def detect(folder: Path) -> str | None:
    """``safetensors`` for a folder with config.json, ``gguf`` for one with a ``.gguf`` and no config.json, else
    None (nothing to load yet). A ``.gguf`` beside a demo build's files is ``gguf`` (models.demo_marker)."""
    if (folder / "config.json").is_file() and not gguf_beside_demo(folder):
        return SAFETENSORS
    return GGUF if gguf_files(folder) else None


def expected_kind(source_url: str, assets: list[str]) -> str | None:
    """What a model not yet downloaded will be, from what it downloads: a ``.gguf`` source or asset is ``gguf``,
    a ``.safetensors`` asset ``safetensors``; None when its names do not say (an archive)."""
    names = [n.split("?", 1)[0].lower() for n in (source_url, *assets)]
    if any(n.endswith(".gguf") for n in names):
        return GGUF
    return SAFETENSORS if any(n.endswith(".safetensors") for n in names) else None


def the_gguf(folder: Path) -> Path:
    """The one ``.gguf`` file of a GGUF folder; ValidationError naming the files when there are several."""
    files = gguf_files(folder)
    if len(files) != 1:
        raise ValidationError(f"the model folder {folder.name} must hold exactly one .gguf file, it holds "
                              f"{len(files)}: {[f.name for f in files]}")
    return files[0]


def declared_kind(model_id: str, fmt: str) -> str | None:
    """The kind model.json's ``format`` names (None when it names none); ValidationError for any other value."""
    if not fmt:
        return None
    kind = FORMATS.get(fmt.strip().lower())
    if kind is None:
        raise ValidationError(f"model.json of {model_id}: format {fmt!r} is not one this service runs "
                              f"(one of {', '.join(sorted(FORMATS))})")
    return kind


def check_folder(model_id: str, fmt: str, folder: Path) -> str:
    """The kind of checkpoint a start loads: the folder's, checked against model.json's ``format``.
    ValidationError for an unknown format, a folder that holds another kind, or several ``.gguf`` files."""
    want = declared_kind(model_id, fmt)
    have = detect(folder)
    if have is None:
        what = "a .gguf file" if want == GGUF else "a checkpoint (config.json, or one .gguf file)"
        raise ValidationError(f"model {model_id} has no checkpoint in its folder: it needs {what}")
    if want is not None and want != have:
        raise ValidationError(f"model.json of {model_id} says format {fmt!r} but its folder holds a {have} "
                              "checkpoint")
    if have == GGUF:
        the_gguf(folder)
    return have

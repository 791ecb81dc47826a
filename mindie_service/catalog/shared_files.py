"""Which files a catalog model shares with another user: resolved real paths compared, so a link into another
model's folder (or a folder inside it) counts as sharing."""
from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)


def real_files(path: Path) -> set[str]:
    """The resolved real paths of ``path`` and of every folder and file under it."""
    root = os.path.realpath(path)
    out = {root}
    for d, dirs, files in os.walk(root):
        out.update(os.path.realpath(os.path.join(d, n)) for n in dirs + files)
    return out


def first_user(folder: Path, users: list[tuple[str, Path]]) -> str | None:
    """The name of the first of ``users`` (name, path) holding any file or folder of ``folder``, else None."""
    mine = real_files(folder)
    for name, path in users:
        if real_files(path) & mine:
            logger.debug("%s shares files with %s", folder, name)
            return name
    return None

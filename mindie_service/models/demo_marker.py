"""Whether a checkpoint holds the random weights of a demo model (``mindie-service demo-model``).

The devkit writes ``devkit.json`` (preset, seed, build version) into every folder it builds; the loader warns
when it loads one and ``/info`` and ``/v1/models`` say so (``demo_weights``). Torch-free and importing nothing
of ours, so the catalog and the server can ask without loading the model code."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MARKER = "devkit.json"  # devkit.presets writes it before config.json


def demo_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The marker of the demo checkpoint ``path`` names (its preset and seed), or None for anything the loader
    does not read as a demo build: a ``.gguf`` file, a folder without config.json (a GGUF folder), a folder
    without the marker (a real Hugging Face checkpoint)."""
    p = Path(path)
    if not (p / "config.json").is_file() or gguf_beside_demo(p):
        return None
    try:
        body = json.loads((p / MARKER).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"preset": "unknown"}  # a marker the devkit wrote but that cannot be read is still a demo build
    return body if isinstance(body, dict) else {"preset": "unknown"}


def gguf_beside_demo(folder: str | os.PathLike[str]) -> bool:
    """A folder holding a ``.gguf`` beside a demo build's files (what ``serve --prepare`` once wrote into a user's
    GGUF folder): it is read from its ``.gguf``, as a folder holding only the ``.gguf`` is."""
    p = Path(folder)
    return p.is_dir() and (p / MARKER).is_file() and any(f.is_file() for f in p.glob("*.gguf"))


def demo_warning(path: str | os.PathLike[str]) -> str | None:
    """The WARNING a load of ``path`` logs when it holds demo weights; None for a real checkpoint."""
    marker = demo_checkpoint(path)
    if marker is None:
        return None
    return (f"{path} holds random demo weights (devkit.json: preset {marker.get('preset', 'unknown')}, built by "
            "`mindie-service demo-model`): its answers are gibberish. Point modelWeightPath at a real "
            "checkpoint to serve a real model")

"""Shared fixtures: demo checkpoints built once per session (no hub downloads anywhere)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]


def _demo(preset: str) -> Path:
    from mindie_service.devkit.presets import build_demo_model
    out = ROOT / "models" / preset
    build_demo_model(preset, str(out), if_missing=True)
    return out


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return _demo("tiny")


@pytest.fixture(scope="session")
def tiny_eos_model() -> Path:
    """tiny with a reachable EOS: greedy generations end on it after a few to a few dozen tokens."""
    return _demo("tiny-eos")

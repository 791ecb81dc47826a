"""Shared fixtures: demo checkpoints built once per session (no hub downloads anywhere)."""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two workers on two cores: each computes on one thread (servers it starts inherit it), so that
    # no worker's OpenMP team waits on a thread the other worker's team has descheduled. A test about teams asks for
    # its threads itself (the `two_threads` fixture).
    os.environ["OMP_NUM_THREADS"] = "1"

ROOT = Path(__file__).resolve().parents[1]


# the real model's session fixtures (tests/real/conftest.py): loaded once per worker that asks for them
REAL_FIXTURES = frozenset({"smollm_llm", "hf_smollm"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Parallel workers (``--dist loadgroup``) take a test file whole, so its module fixtures are built once; the
    tests that use the real model share one worker, so the real model and its transformers reference load once."""
    for item in items:
        real = REAL_FIXTURES & set(getattr(item, "fixturenames", ()))
        item.add_marker(pytest.mark.xdist_group("real" if real else item.nodeid.split("::")[0]))


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


class StillClock:
    """A step clock that stands still: every step an engine times takes 0 s on it."""

    def __call__(self) -> float:
        return 0.0


@pytest.fixture(autouse=True)
def still_step_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Engines time their steps and drafts with ``LLMEngine.step_clock``, and the burst pacer and the speculation
    policy decide from those times. In the tests it stands still, so their decisions are a fast quiet machine's
    whatever the machine's load (a loaded one's slow steps ran no bursts). A test about pacing drives an engine's
    clock itself (test_multi_step). Only where the engine module is loaded already: importing it loads torch."""
    core = sys.modules.get("mindie_service.engine.core")
    if core is not None:
        monkeypatch.setattr(core.LLMEngine, "step_clock", StillClock())


@pytest.fixture
def two_threads() -> Iterator[None]:
    """A team of two threads for the test (kernels follow torch's intra-op threads), whatever the worker's."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield
    finally:
        torch.set_num_threads(before)

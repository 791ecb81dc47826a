"""A local catalog source folder is copied with its links followed only inside the allowed folders (a
Hugging Face cache snapshot links into its blobs folder), within the download cap."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from mindie_service.catalog.download import Progress, Source, fetch_into
from mindie_service.errors import MediaError, ValidationError
from mindie_service.netguard import FetchPolicy


def _fetch(src: Path, staging: Path, allowed: Path, cap: int = 1 << 20) -> Path:
    staging.mkdir()
    policy = FetchPolicy(allowed_local_paths=(str(allowed),))
    asyncio.run(fetch_into("m", [], Source(path=src), staging, cap, policy, Progress()))
    return staging / "ckpt"


def _snapshot(root: Path) -> Path:
    """A hub-cache-like layout: snapshot/config.json -> ../blobs/abc."""
    (root / "blobs").mkdir(parents=True)
    (root / "blobs" / "abc").write_text('{"model_type": "llama"}')
    snap = root / "snapshot"
    snap.mkdir()
    os.symlink(root / "blobs" / "abc", snap / "config.json")
    (snap / "weights.bin").write_bytes(b"w" * 100)
    return snap


def test_links_inside_the_allowed_folders_are_followed(tmp_path):
    snap = _snapshot(tmp_path / "allowed")
    out = _fetch(snap, tmp_path / "staging", tmp_path / "allowed")
    assert (out / "config.json").read_text() == '{"model_type": "llama"}' and not (out / "config.json").is_symlink()


def test_a_link_out_of_the_allowed_folders_is_refused(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    snap = _snapshot(tmp_path / "allowed")
    os.symlink(secret, snap / "tokenizer.json")
    with pytest.raises(MediaError, match="outside the allowed folders") as exc:
        _fetch(snap, tmp_path / "staging", tmp_path / "allowed")
    assert exc.value.status == 403 and not (tmp_path / "staging" / "ckpt").exists()


def test_a_linked_folder_cycle_and_the_cap_are_refused(tmp_path):
    snap = _snapshot(tmp_path / "allowed")
    with pytest.raises(MediaError, match="over the cap") as exc:
        _fetch(snap, tmp_path / "s1", tmp_path / "allowed", cap=50)
    assert exc.value.status == 413
    os.symlink(snap, snap / "loop")
    with pytest.raises(ValidationError, match="links back into itself"):
        _fetch(snap, tmp_path / "s2", tmp_path / "allowed")


@pytest.mark.parametrize("kind", ["folder", "gguf", "archive"])
def test_a_local_copy_reports_the_bytes_it_copied(tmp_path, kind):
    """metadata.download's bytes_done counts a local copy (it read 0 after copying 98 MB, issue 43)."""
    import tarfile

    allowed = tmp_path / "allowed"
    snap = _snapshot(allowed)
    (snap / "weights.bin").write_bytes(b"w" * (3 << 20))  # several CHUNKs
    src = {"folder": snap, "gguf": allowed / "m.gguf", "archive": allowed / "m.tar"}[kind]
    if kind == "gguf":
        src.write_bytes(b"GGUF" + b"\0" * (3 << 20))
    elif kind == "archive":
        with tarfile.open(src, "w") as t:
            t.add(snap / "weights.bin", arcname="ckpt/weights.bin")
    staging = tmp_path / "staging"
    staging.mkdir()
    prog = Progress()
    policy = FetchPolicy(allowed_local_paths=(str(allowed),))
    asyncio.run(fetch_into("m", [], Source(path=src), staging, 1 << 30, policy, prog))
    copied = sum(p.stat().st_size for p in staging.rglob("*") if p.is_file())
    want = src.stat().st_size if kind == "archive" else copied
    assert prog.as_json() == {"bytes_done": want, "bytes_total": want} and want >= 3 << 20

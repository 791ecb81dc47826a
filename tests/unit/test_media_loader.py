"""multimodal.media_loader: MindIE list-form inputs validated, media fetched concurrently and decoded
in the executor, each part hashed for prefix-cache keys."""
from __future__ import annotations

import asyncio
import base64
import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from PIL import Image

from mindie_service.devkit import synth
from mindie_service.errors import MediaError
from mindie_service.netguard import FetchPolicy
from multimodal import (
    DecodeOptions,
    LoadedPart,
    MediaItem,
    MediaPolicy,
    TextPart,
    load_media,
    parse_parts,
)
from multimodal import media_loader as loader

POLICY = MediaPolicy()


def parse_refused(inputs: Any, policy: MediaPolicy = POLICY) -> MediaError:
    with pytest.raises(MediaError) as info:
        parse_parts(inputs, policy)
    assert info.value.status == 422
    return info.value


# ---------------------------------------------------------------------------------------------
# parse_parts


def test_parse_mindie_and_openai_forms() -> None:
    parts = parse_parts([
        {"type": "text", "text": "describe"},
        {"type": "image_url", "image_url": "/data/a.png"},
        {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}},
        {"type": "audio_url", "audio_url": "data:audio/wav;base64,AAAA"},
    ], POLICY)
    assert parts == [
        TextPart(0, "describe"),
        MediaItem(1, "image", "/data/a.png"),
        MediaItem(2, "video", "https://example.com/v.mp4"),
        MediaItem(3, "audio", "data:audio/wav;base64,AAAA"),
    ]


def test_unknown_part_type_is_refused_naming_index_and_type() -> None:
    err = parse_refused([{"type": "text", "text": "a"}, {"type": "pdf_url", "pdf_url": "/x"}])
    assert "inputs[1]" in err.message and "pdf_url" in err.message
    assert "inputs[0]" in parse_refused([{"image_url": "/x.png"}]).message


def test_empty_text_is_refused() -> None:
    err = parse_refused([{"type": "text", "text": ""}])
    assert "inputs[0] (text)" in err.message and "empty" in err.message
    assert "inputs[0] (text)" in parse_refused([{"type": "text", "text": 3}]).message


@pytest.mark.parametrize("ref", [None, 42, ["/a.png"], {"href": "/a.png"}, "", "   "])
def test_non_string_or_empty_ref_is_refused(ref: Any) -> None:
    err = parse_refused([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": ref}])
    assert "inputs[1] (image_url)" in err.message


def test_21_media_items_are_refused() -> None:
    items = [{"type": "image_url", "image_url": f"/img/{i}.png"} for i in range(20)]
    assert len(parse_parts(items + [{"type": "text", "text": "ok"}], POLICY)) == 21
    err = parse_refused(items + [{"type": "audio_url", "audio_url": "/a.wav"}])
    assert "inputs[20] (audio_url)" in err.message and "at most 20" in err.message


def test_inputs_must_be_a_list_of_objects() -> None:
    parse_refused([])
    parse_refused("text")
    assert "inputs[1]" in parse_refused([{"type": "text", "text": "a"}, "b"]).message


# ---------------------------------------------------------------------------------------------
# load_media


class CountingExecutor(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.threads: list[str] = []

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def, override]
        def wrapped() -> Any:
            self.threads.append(threading.current_thread().name)
            return fn(*args, **kwargs)

        return super().submit(wrapped)


@pytest.fixture()
def media_dir(tmp_path: Any) -> Any:
    (tmp_path / "a.png").write_bytes(synth.image_bytes(40, 30))
    (tmp_path / "clip.mp4").write_bytes(synth.video_bytes())
    (tmp_path / "tone.flac").write_bytes(synth.audio_bytes(rate=22050, fmt="FLAC"))
    return tmp_path


def test_load_media_decodes_every_kind_in_order_in_the_executor(media_dir: Any) -> None:
    policy = MediaPolicy(FetchPolicy(allowed_local_paths=(str(media_dir),)))
    png = (media_dir / "a.png").read_bytes()
    wav = synth.audio_bytes(seconds=0.5, rate=16000, fmt="WAV")
    parts = parse_parts([
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": str(media_dir / "a.png")},
        {"type": "video_url", "video_url": str(media_dir / "clip.mp4")},
        {"type": "audio_url", "audio_url": str(media_dir / "tone.flac")},
        {"type": "image_url", "image_url": "data:image/png;base64," + base64.b64encode(png).decode()},
        {"type": "audio_url", "audio_url": "data:audio/wav;base64," + base64.b64encode(wav).decode()},
    ], policy)
    executor = CountingExecutor()
    try:
        loaded = asyncio.run(load_media(parts, policy, executor,
                                        DecodeOptions(num_video_frames=3,
                                                      audio_sampling_rate=16000)))
    finally:
        executor.shutdown()
    assert [p.kind for p in loaded] == ["text", "image", "video", "audio", "image", "audio"]
    assert [p.index for p in loaded] == list(range(6))
    assert all(isinstance(p, LoadedPart) for p in loaded)
    assert loaded[0].payload == "look"
    assert isinstance(loaded[1].payload, Image.Image) and loaded[1].payload.size == (40, 30)
    assert len(loaded[2].payload) == 3 and loaded[2].payload[0].shape == (64, 64, 3)
    assert loaded[3].payload.dtype == np.float32 and abs(len(loaded[3].payload) - 16000) <= 16
    assert len(loaded[5].payload) == 8000
    assert [p.format for p in loaded] == [None, "png", "mp4", "flac", "png", "wav"]
    # The hash is of the raw bytes: the same image by path or data: URI hashes the same.
    assert loaded[1].sha256 == loaded[4].sha256 == hashlib.sha256(png).hexdigest()
    assert loaded[2].sha256 == hashlib.sha256((media_dir / "clip.mp4").read_bytes()).hexdigest()
    # Every media part was decoded in the executor, off the IO loop thread.
    assert len(executor.threads) == 5
    assert threading.main_thread().name not in executor.threads


def test_one_failure_cancels_the_other_fetches_and_names_its_part(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cancelled: list[int] = []

    async def fake_fetch(ref: str, kind: str, index: int, policy: MediaPolicy,
                         **kwargs: Any) -> bytes:
        if ref == "slow":
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(index)
                raise
        raise MediaError(f"inputs[{index}] ({kind}_url): refused", 403)

    monkeypatch.setattr(loader, "fetch_media", fake_fetch)
    parts = [MediaItem(0, "image", "slow"), TextPart(1, "x"), MediaItem(2, "video", "bad")]
    with ThreadPoolExecutor(1) as executor, pytest.raises(MediaError) as info:
        asyncio.run(load_media(parts, POLICY, executor))
    assert info.value.status == 403 and "inputs[2] (video_url)" in info.value.message
    assert cancelled == [0]


def test_decode_failure_names_the_part(media_dir: Any) -> None:
    jpeg = synth.image_bytes(64, 64, fmt="JPEG")
    (media_dir / "cut.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    policy = MediaPolicy(FetchPolicy(allowed_local_paths=(str(media_dir),)))
    parts = parse_parts([{"type": "text", "text": "a"}, {"type": "text", "text": "b"},
                         {"type": "image_url", "image_url": str(media_dir / "cut.jpg")}], policy)
    with ThreadPoolExecutor(1) as executor, pytest.raises(MediaError) as info:
        asyncio.run(load_media(parts, policy, executor))
    assert info.value.status == 422 and "inputs[2] (image_url)" in info.value.message


def test_request_byte_budget_spans_all_parts(media_dir: Any) -> None:
    size = (media_dir / "clip.mp4").stat().st_size
    policy = MediaPolicy(FetchPolicy(allowed_local_paths=(str(media_dir),)), max_request_bytes=size * 2)
    parts = parse_parts([{"type": "video_url", "video_url": str(media_dir / "clip.mp4")}] * 3,
                        policy)
    with ThreadPoolExecutor(1) as executor, pytest.raises(MediaError) as info:
        asyncio.run(load_media(parts, policy, executor))
    assert info.value.status == 413 and "per-request total" in info.value.message

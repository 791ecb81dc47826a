"""Issue #16, item 3 and two Low items: media decoding is bounded in total per request (decoded bytes, aspect
ratio, pixels after resizing, frames decoded per video), and hostile files or URLs are 4xx, never 500."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import av
import numpy as np
import pytest

from mindie_service.devkit import synth
from mindie_service.errors import MediaError
from multimodal import MediaItem, MediaPolicy, load_media
from multimodal.decode import decode_image, decode_video, sample_indices
from multimodal.loader import DecodeOptions


def _data_uri(data: bytes, mime: str) -> str:
    import base64
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def _load(items: list[MediaItem], policy: MediaPolicy, options: DecodeOptions | None = None):
    with ThreadPoolExecutor(2) as pool:
        return asyncio.run(load_media(items, policy, pool, options))


def test_extreme_aspect_ratio_is_refused_before_the_processor_resizes_it():
    # 2000x1: 2,000 pixels pass the pixel cap, but a shortest-edge resize to 32 makes it 64,000 x 32.
    png = synth.image_bytes(2000, 1)
    with pytest.raises(MediaError) as err:
        decode_image(png, 0, MediaPolicy(max_aspect_ratio=200))
    assert err.value.status == 413 and "aspect ratio" in err.value.message
    # Within the ratio, the pixels after resizing are bounded too.
    with pytest.raises(MediaError, match="resized for the model") as err:
        decode_image(synth.image_bytes(150, 1), 0, MediaPolicy(max_image_pixels=4000), resize_shortest_edge=32)
    assert err.value.status == 413


def test_decoded_bytes_of_all_items_together_are_bounded():
    # Three 100x100 images: 30,000 decoded bytes each; the request may take 80,000 in all.
    uri = _data_uri(synth.image_bytes(100, 100), "image/png")
    items = [MediaItem(i, "image", uri) for i in range(3)]
    with pytest.raises(MediaError) as err:
        _load(items, MediaPolicy(max_decoded_bytes=80_000))
    assert err.value.status == 413 and "maxDecodedMediaBytes" in err.value.message
    assert len(_load(items[:2], MediaPolicy(max_decoded_bytes=80_000))) == 2


def _video(frames: int, gop: int, size: int = 32) -> bytes:
    import io
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as c:
        # No scene-cut keyframes: ``gop`` alone decides where the keyframes are.
        s = c.add_stream("mpeg4", rate=12, options={"g": str(gop), "sc_threshold": "1000000000"})
        s.width = s.height = size
        s.pix_fmt = "yuv420p"
        for i in range(frames):
            rgb = np.zeros((size, size, 3), np.uint8)
            rgb[..., 0] = 2 * i  # frame i is solid red 2i (i < 128)
            for p in s.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return buf.getvalue()


def test_frames_decoded_per_video_are_bounded():
    policy = MediaPolicy(max_video_frames_decoded=20)
    # Keyframes everywhere: the sampled frames are reached by seeking, well under 20 decoded frames.
    video = _video(120, gop=1)
    frames = decode_video(video, 0, policy, 4)
    every = decode_video(video, 0, MediaPolicy(max_video_frames_decoded=1000), 120)  # the sequential path
    assert all(np.array_equal(f, every[i]) for f, i in zip(frames, sample_indices(120, 4), strict=True))
    # One keyframe: reaching frame 119 needs 120 decoded frames (the old code decoded them all).
    with pytest.raises(MediaError) as err:
        decode_video(_video(120, gop=600), 0, policy, 4)
    assert err.value.status == 413 and "maxVideoFramesDecoded" in err.value.message


def test_truncated_mp4_is_a_422(tmp_path: Path):
    path = tmp_path / "fast.mp4"
    with av.open(str(path), "w", format="mp4", options={"movflags": "faststart"}) as c:
        s = c.add_stream("mpeg4", rate=12)
        s.width = s.height = 64
        s.pix_fmt = "yuv420p"
        for i in range(24):
            for p in s.encode(av.VideoFrame.from_ndarray(np.full((64, 64, 3), i, np.uint8), format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    data = path.read_bytes()
    statuses = set()
    for n in range(100, 1200, 25):  # every cut, the old AttributeError one (~350 bytes) among them
        try:
            decode_video(data[:n], 0, MediaPolicy(), 8)  # a cut past the first frames may still decode
        except MediaError as e:  # anything else (the old AttributeError) fails the test: a 500
            statuses.add(e.status)
    assert statuses == {422}


def test_malformed_ipv6_url_is_a_422():
    policy = MediaPolicy(allow_private_urls=True)
    with pytest.raises(MediaError) as err:
        _load([MediaItem(0, "image", "http://[::1/x.png")], policy)
    assert err.value.status == 422

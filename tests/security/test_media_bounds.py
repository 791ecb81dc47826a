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
from mindie_service.netguard import FetchPolicy
from multimodal import MediaItem, MediaPolicy, load_media
from multimodal.decode import decode_image, decode_video, sample_indices
from multimodal.media_loader import DecodeOptions


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
    policy = MediaPolicy(FetchPolicy(allow_private_urls=True))
    with pytest.raises(MediaError) as err:
        _load([MediaItem(0, "image", "http://[::1/x.png")], policy)
    assert err.value.status == 422


# -- a large encoded video is spooled to a temporary file, not held in memory -----------------------------
SPOOL = 8192  # MediaPolicy.spool_bytes, lowered: the test video is ~40 KB


def _noise_video(frames: int = 40, size: int = 64) -> bytes:
    import io
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as c:
        s = c.add_stream("mpeg4", rate=12)
        s.width = s.height = size
        s.pix_fmt = "yuv420p"
        for _ in range(frames):
            for p in s.encode(av.VideoFrame.from_ndarray(rng.integers(0, 255, (size, size, 3), np.uint8),
                                                         format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return buf.getvalue()


BIG_VIDEO = _noise_video()


def _fds_into(folder: Path) -> list[str]:
    """This process's open descriptors on files in ``folder`` (an unlinked temporary file shows as
    ``folder/#123 (deleted)``)."""
    import os
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)):
            out.append(target)
    return out


@pytest.fixture()
def spool_watch(monkeypatch, tmp_path):
    """Fresh spool counters, a spool folder of the test's own, and a spy on what the video decoder got."""
    from multimodal import media_loader as loader, spool
    stats = spool.SpoolStats()
    monkeypatch.setattr(spool, "SPOOL_STATS", stats)
    folder = tmp_path / "spool"
    folder.mkdir()
    seen: list[dict] = []
    real = loader.decode_video

    def spy(data, *args, **kwargs):
        seen.append({"type": type(data).__name__, "on_disk": getattr(data, "on_disk", False),
                     "fds": _fds_into(folder), "spooled_open": stats.files_open})
        return real(data, *args, **kwargs)

    monkeypatch.setattr(loader, "decode_video", spy)
    return {"stats": stats, "folder": folder, "seen": seen,
            "policy": MediaPolicy(FetchPolicy(allow_private_urls=True, allowed_local_paths=(str(tmp_path),)),
                                  spool_bytes=SPOOL, spool_dir=str(folder))}


def _expected_frames() -> list[np.ndarray]:
    return decode_video(BIG_VIDEO, 0, MediaPolicy(), 4)


def _check_spooled(w, loaded) -> None:
    st = w["stats"]
    assert [d["on_disk"] for d in w["seen"]] == [True]  # PyAV read it from the file
    assert st.files_total == 1 and w["seen"][0]["spooled_open"] == 1 and len(w["seen"][0]["fds"]) == 1
    assert st.peak_memory <= SPOOL < len(BIG_VIDEO)  # never more than the threshold held in memory
    assert st.files_open == 0 and _fds_into(w["folder"]) == []  # the temporary file is gone
    assert all(np.array_equal(a, b) for a, b in zip(loaded[0].payload, _expected_frames(), strict=True))
    import hashlib
    assert loaded[0].sha256 == hashlib.sha256(BIG_VIDEO).hexdigest() and loaded[0].nbytes == len(BIG_VIDEO)


def test_a_large_data_uri_video_is_spooled_and_the_file_removed(spool_watch):
    loaded = _load([MediaItem(0, "video", _data_uri(BIG_VIDEO, "video/mp4"))], spool_watch["policy"],
                   DecodeOptions(num_video_frames=4))
    _check_spooled(spool_watch, loaded)


def test_a_large_http_video_is_spooled_while_it_downloads(spool_watch):
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets
    from tornado.web import Application, RequestHandler

    class Video(RequestHandler):
        async def get(self) -> None:
            self.set_header("Content-Type", "video/mp4")
            for at in range(0, len(BIG_VIDEO), 4096):  # arrives in pieces, as a real download does
                self.write(BIG_VIDEO[at:at + 4096])
                await self.flush()

    async def main():
        server = HTTPServer(Application([(r"/v.mp4", Video)]))
        [sock] = bind_sockets(0, "127.0.0.1")
        server.add_sockets([sock])
        try:
            with ThreadPoolExecutor(2) as pool:
                url = f"http://127.0.0.1:{sock.getsockname()[1]}/v.mp4"
                return await load_media([MediaItem(0, "video", url)], spool_watch["policy"], pool,
                                        DecodeOptions(num_video_frames=4))
        finally:
            server.stop()
    _check_spooled(spool_watch, asyncio.run(main()))


def test_a_large_local_video_is_decoded_from_its_file_without_a_copy(spool_watch, tmp_path):
    path = tmp_path / "big.mp4"
    path.write_bytes(BIG_VIDEO)
    loaded = _load([MediaItem(0, "video", str(path))], spool_watch["policy"], DecodeOptions(num_video_frames=4))
    st = spool_watch["stats"]
    assert [d["on_disk"] for d in spool_watch["seen"]] == [True] and st.files_total == 0 and st.peak_memory == 0
    assert all(np.array_equal(a, b) for a, b in zip(loaded[0].payload, _expected_frames(), strict=True))
    assert _fds_into(tmp_path) == []  # its descriptor was closed after decoding


def test_a_small_video_stays_in_memory(spool_watch):
    small = _video(8, gop=1)
    assert len(small) < SPOOL
    _load([MediaItem(0, "video", _data_uri(small, "video/mp4"))], spool_watch["policy"])
    assert [d["on_disk"] for d in spool_watch["seen"]] == [False] and spool_watch["stats"].files_total == 0


def test_a_spooled_video_that_fails_to_decode_leaves_no_file(spool_watch):
    corrupt = BIG_VIDEO[:64] + bytes(len(BIG_VIDEO))  # an MP4 signature, then zeros
    with pytest.raises(MediaError) as err:
        _load([MediaItem(0, "video", _data_uri(corrupt, "video/mp4"))], spool_watch["policy"])
    assert err.value.status == 422
    assert spool_watch["stats"].files_total == 1 and spool_watch["stats"].files_open == 0
    assert _fds_into(spool_watch["folder"]) == []


def test_a_request_cancelled_while_its_video_decodes_leaves_no_file(spool_watch, monkeypatch):
    import threading
    from multimodal import media_loader as loader
    entered, release = threading.Event(), threading.Event()
    spy = loader.decode_video

    def slow(data, *args, **kwargs):
        entered.set()
        release.wait(10)
        return spy(data, *args, **kwargs)

    monkeypatch.setattr(loader, "decode_video", slow)

    async def main():
        with ThreadPoolExecutor(1) as pool:
            task = asyncio.ensure_future(load_media([MediaItem(0, "video", _data_uri(BIG_VIDEO, "video/mp4"))],
                                                    spool_watch["policy"], pool))
            while not entered.is_set():
                await asyncio.sleep(0.01)
            task.cancel()  # the client left while its video was decoding
            with pytest.raises(asyncio.CancelledError):
                await task
            release.set()
        # the pool has shut down: the decode that was running has ended
    asyncio.run(main())
    assert spool_watch["stats"].files_total == 1 and spool_watch["stats"].files_open == 0
    assert _fds_into(spool_watch["folder"]) == []

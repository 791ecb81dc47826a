"""multimodal.sniff and multimodal.decode: format from magic bytes; images, videos and audio
decoded with their sizes checked from the header first."""
from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from mindie_service.devkit import synth
from mindie_service.errors import MediaError
from multimodal import (
    MediaPolicy,
    decode_audio,
    decode_image,
    decode_video,
    require_format,
    sample_indices,
    sniff,
)

POLICY = MediaPolicy()


def refused(fn, *args, index: int, kind: str) -> MediaError:  # type: ignore[no-untyped-def]
    with pytest.raises(MediaError) as info:
        fn(*args)
    err = info.value
    assert 400 <= err.status < 500
    assert f"inputs[{index}] ({kind}_url)" in err.message
    return err


# ---------------------------------------------------------------------------------------------
# sniff


@pytest.fixture(scope="module")
def videos() -> dict[str, bytes]:
    return {fmt: synth.video_bytes(fmt=fmt) for fmt in ("mp4", "avi", "wmv")}


def test_sniff_names_formats_from_magic_bytes(videos: dict[str, bytes]) -> None:
    assert sniff(synth.image_bytes(fmt="PNG")).name == "png"
    assert sniff(synth.image_bytes(fmt="JPEG")).name == "jpeg"
    for fmt, data in videos.items():
        assert sniff(data).name == fmt
    assert sniff(synth.audio_bytes(fmt="WAV")).name == "wav"
    assert sniff(synth.audio_bytes(fmt="FLAC")).name == "flac"
    assert sniff(b"ID3\x04\x00" + b"\0" * 20).name == "mp3"
    assert sniff(b"\xff\xfb\x90\x00" + b"\0" * 20).name == "mp3"
    assert sniff(b"\x00\x00\x00\x18ftypqt  ").name == "mov"
    assert sniff(b"GIF89a....").name == "gif"
    assert sniff(b"hello world") is None
    assert sniff(b"") is None


def test_require_format_refuses_wrong_kind_naming_what_it_is() -> None:
    err = refused(require_format, synth.image_bytes(), "video", 4, index=4, kind="video")
    assert err.status == 415 and "PNG image" in err.message and "mp4" in err.message
    err = refused(require_format, b"GIF89a" + b"\0" * 30, "image", 0, index=0, kind="image")
    assert "GIF image" in err.message
    err = refused(require_format, b"just text", "audio", 1, index=1, kind="audio")
    assert "not a recognised" in err.message


# ---------------------------------------------------------------------------------------------
# images


def test_png_and_jpeg_decode_to_rgb() -> None:
    for fmt in ("PNG", "JPEG"):
        image = decode_image(synth.image_bytes(40, 30, fmt=fmt), 0, POLICY)
        assert image.mode == "RGB" and image.size == (40, 30)
    rgba = synth.image_bytes(8, 8, fmt="PNG", mode="RGBA", color=(1, 2, 3, 128))
    assert decode_image(rgba, 0, POLICY).mode == "RGB"


def test_truncated_jpeg_is_refused_naming_the_part() -> None:
    jpeg = synth.image_bytes(64, 64, fmt="JPEG")
    err = refused(decode_image, jpeg[: len(jpeg) // 2], 3, POLICY, index=3, kind="image")
    assert err.status == 422 and "truncated or corrupt" in err.message


@pytest.mark.timeout(10)
def test_pixel_bomb_header_is_refused_before_decoding() -> None:
    bomb = synth.png_header_bomb(100_000, 100_000)
    assert len(bomb) < 2000
    err = refused(decode_image, bomb, 1, POLICY, index=1, kind="image")
    assert err.status == 413 and "pixels" in err.message


def test_pixel_limit_comes_from_the_policy() -> None:
    policy = MediaPolicy(max_image_pixels=500)
    err = refused(decode_image, synth.png_header_bomb(30, 30), 2, policy, index=2, kind="image")
    assert err.status == 413 and "30x30" in err.message


def test_image_decoder_refuses_other_formats() -> None:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, format="GIF")
    err = refused(decode_image, buf.getvalue(), 0, POLICY, index=0, kind="image")
    assert err.status == 415


# ---------------------------------------------------------------------------------------------
# videos


def frame_ids(frames: list[np.ndarray]) -> list[int]:
    """Frame index encoded as red = 20 * index (lossy codecs: round to the nearest step)."""
    return [int(round(float(f[..., 0].mean()) / synth.FRAME_RED_STEP)) for f in frames]


def test_sample_indices_are_linspace_rounded() -> None:
    assert sample_indices(12, 4) == [0, 4, 7, 11]
    assert sample_indices(12, 1) == [0]
    assert sample_indices(3, 5) == [0, 0, 1, 2, 2]
    assert sample_indices(12, 12) == list(range(12))


@pytest.mark.parametrize("fmt", ["mp4", "avi", "wmv"])
def test_video_frames_sampled_at_linspace_indices(videos: dict[str, bytes], fmt: str) -> None:
    # wmv (ASF) reports no frame count: the decoder counts packets first.
    frames = decode_video(videos[fmt], 0, POLICY, 4)
    assert len(frames) == 4
    assert all(f.shape == (64, 64, 3) and f.dtype == np.uint8 for f in frames)
    assert frame_ids(frames) == np.linspace(0, 11, 4).round().astype(int).tolist()


def test_more_frames_requested_than_the_video_has(videos: dict[str, bytes]) -> None:
    frames = decode_video(videos["mp4"], 0, POLICY, 20)
    assert frame_ids(frames) == sample_indices(12, 20)


@pytest.mark.parametrize("fmt", ["mp4", "wmv"])
def test_video_frame_count_limit(videos: dict[str, bytes], fmt: str) -> None:
    policy = MediaPolicy(max_video_frames_total=5)
    err = refused(decode_video, videos[fmt], 2, policy, 4, index=2, kind="video")
    assert err.status == 413 and "frames" in err.message


def test_video_duration_limit(videos: dict[str, bytes]) -> None:
    policy = MediaPolicy(max_video_seconds=0.5)  # the clip lasts 1 s
    err = refused(decode_video, videos["mp4"], 1, policy, 4, index=1, kind="video")
    assert err.status == 413 and "long" in err.message


def test_video_frame_size_limit(videos: dict[str, bytes]) -> None:
    policy = MediaPolicy(max_image_pixels=1000)  # frames are 64x64
    err = refused(decode_video, videos["avi"], 0, policy, 4, index=0, kind="video")
    assert err.status == 413 and "64x64" in err.message


def test_truncated_video_is_refused(videos: dict[str, bytes]) -> None:
    data = videos["mp4"]
    err = refused(decode_video, data[: len(data) // 2], 5, POLICY, 4, index=5, kind="video")
    assert err.status == 422 and "truncated or corrupt" in err.message


def test_png_given_as_video_is_refused() -> None:
    err = refused(decode_video, synth.image_bytes(), 0, POLICY, 4, index=0, kind="video")
    assert err.status == 415 and "PNG image" in err.message


# ---------------------------------------------------------------------------------------------
# audio


def dominant_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples))
    return float(np.fft.rfftfreq(len(samples), 1 / rate)[int(np.argmax(spectrum))])


@pytest.mark.parametrize("fmt, rate, channels", [
    ("WAV", 44100, 1), ("FLAC", 48000, 2), ("MP3", 44100, 2), ("WAV", 8000, 1),
])
def test_audio_resampled_to_target_rate_mono(fmt: str, rate: int, channels: int) -> None:
    data = synth.audio_bytes(seconds=1.0, rate=rate, channels=channels, fmt=fmt)
    samples = decode_audio(data, 0, POLICY, 16000)
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert abs(len(samples) - 16000) <= (1200 if fmt == "MP3" else 16)  # mp3 adds padding
    assert abs(dominant_hz(samples, 16000) - 440) <= 2


def test_audio_at_target_rate_is_not_resampled() -> None:
    data = synth.audio_bytes(seconds=0.5, rate=16000, fmt="WAV")
    samples = decode_audio(data, 0, POLICY, 16000)
    expected, _ = sf.read(io.BytesIO(data), dtype="float32")
    np.testing.assert_array_equal(samples, expected)


def test_audio_duration_limit() -> None:
    data = synth.audio_bytes(seconds=2.0, rate=8000, fmt="FLAC")
    err = refused(decode_audio, data, 3, MediaPolicy(max_audio_seconds=1.0), 16000,
                  index=3, kind="audio")
    assert err.status == 413 and "long" in err.message


def test_corrupt_audio_is_refused() -> None:
    data = b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\xff" * 40
    err = refused(decode_audio, data, 2, POLICY, 16000, index=2, kind="audio")
    assert err.status == 422 and "truncated or corrupt" in err.message


def test_image_given_as_audio_is_refused() -> None:
    err = refused(decode_audio, synth.image_bytes(fmt="JPEG"), 1, POLICY, 16000,
                  index=1, kind="audio")
    assert err.status == 415 and "JPEG image" in err.message

"""Small synthetic media made on the fly, for tests, demos and benchmarks (no files shipped).

Videos encode their frame index as a colour (red = 20 * index) so a test can tell which frames
were sampled; audio is a sine so a test can check the frequency survives resampling."""
from __future__ import annotations

import io
import struct
import zlib

import av
import numpy as np
import soundfile as sf
from PIL import Image

FRAME_RED_STEP = 20


def image_bytes(width: int = 32, height: int = 24, fmt: str = "PNG", mode: str = "RGB",
                color: tuple[int, ...] = (200, 30, 60)) -> bytes:
    """A solid-colour image encoded as ``fmt`` (PNG or JPEG)."""
    buf = io.BytesIO()
    Image.new(mode, (width, height), color[: len(mode)]).save(buf, format=fmt)
    return buf.getvalue()


def png_header_bomb(width: int = 100_000, height: int = 100_000) -> bytes:
    """A tiny PNG whose header claims ``width`` x ``height`` pixels (a decompression bomb's
    header: only a pixel-count check before decoding keeps it cheap)."""

    def chunk(tag: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + tag + body
                + struct.pack(">I", zlib.crc32(tag + body) & 0xFFFFFFFF))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 1024)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


_VIDEO_CODECS = {"mp4": ("mp4", "mpeg4"), "avi": ("avi", "mpeg4"), "wmv": ("asf", "wmv2")}


def video_bytes(num_frames: int = 12, size: int = 64, fmt: str = "mp4", rate: int = 12) -> bytes:
    """A ``num_frames``-frame video (mp4, avi or wmv) whose frame i is solid red
    ``FRAME_RED_STEP * i`` (mod 256)."""
    container_fmt, codec = _VIDEO_CODECS[fmt]
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container_fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for i in range(num_frames):
            rgb = np.zeros((size, size, 3), np.uint8)
            rgb[..., 0] = (FRAME_RED_STEP * i) % 256
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def sine(seconds: float = 1.0, rate: int = 44100, freq: float = 440.0,
         channels: int = 1) -> np.ndarray:
    """float32 samples, shape (frames,) or (frames, channels)."""
    t = np.arange(int(seconds * rate)) / rate
    wave = (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    return wave if channels == 1 else np.repeat(wave[:, None], channels, axis=1)


def audio_bytes(seconds: float = 1.0, rate: int = 44100, freq: float = 440.0,
                channels: int = 1, fmt: str = "WAV") -> bytes:
    """A sine encoded as ``fmt`` (WAV, FLAC or MP3, whatever libsndfile writes)."""
    buf = io.BytesIO()
    subtype = {"WAV": "PCM_16", "FLAC": "PCM_16", "MP3": "MPEG_LAYER_III"}[fmt]
    sf.write(buf, sine(seconds, rate, freq, channels), rate, format=fmt, subtype=subtype)
    return buf.getvalue()

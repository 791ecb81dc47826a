"""Media format from the content's first bytes, never from a name, extension or Content-Type.

``sniff`` names what the bytes are (including a few formats we do not accept, so the error can
say "content is a GIF image"); ``require_format`` turns that into the accepted format for a
part's kind or a 415 naming the part."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from mindie_service.errors import MediaError

from .policy import MediaKind, where

logger = logging.getLogger(__name__)

# Enough bytes to recognise every format below.
SNIFF_BYTES = 64

_ASF_GUID = bytes.fromhex("3026b2758e66cf11a6d900aa0062ce6c")


@dataclass(frozen=True)
class MediaFormat:
    """A recognised format. ``demuxer`` is the FFmpeg demuxer name for videos, ``pil`` the
    Pillow plugin name for images."""

    name: str
    kind: MediaKind
    description: str
    supported: bool = True
    demuxer: str | None = None
    pil: str | None = None


JPEG = MediaFormat("jpeg", "image", "a JPEG image", pil="JPEG")
PNG = MediaFormat("png", "image", "a PNG image", pil="PNG")
MP4 = MediaFormat("mp4", "video", "an MP4 video", demuxer="mov")
MOV = MediaFormat("mov", "video", "a QuickTime (MOV) video", demuxer="mov")
AVI = MediaFormat("avi", "video", "an AVI video", demuxer="avi")
WMV = MediaFormat("wmv", "video", "a WMV/ASF video", demuxer="asf")
WAV = MediaFormat("wav", "audio", "a WAV audio file")
FLAC = MediaFormat("flac", "audio", "a FLAC audio file")
MP3 = MediaFormat("mp3", "audio", "an MP3 audio file")
# Recognised only to name them in errors.
GIF = MediaFormat("gif", "image", "a GIF image", supported=False)
WEBP = MediaFormat("webp", "image", "a WebP image", supported=False)
BMP = MediaFormat("bmp", "image", "a BMP image", supported=False)
HEIF = MediaFormat("heif", "image", "a HEIF/AVIF image", supported=False)
M4A = MediaFormat("m4a", "audio", "an M4A/AAC audio file", supported=False)
OGG = MediaFormat("ogg", "audio", "an Ogg file", supported=False)
MKV = MediaFormat("mkv", "video", "a Matroska/WebM video", supported=False)

SUPPORTED: dict[MediaKind, tuple[MediaFormat, ...]] = {
    "image": (JPEG, PNG),
    "video": (MP4, MOV, AVI, WMV),
    "audio": (WAV, FLAC, MP3),
}

_HEIF_BRANDS = {b"heic", b"heix", b"hevc", b"heim", b"heis", b"mif1", b"msf1", b"avif", b"avis"}
_M4A_BRANDS = {b"M4A ", b"M4B ", b"M4P "}


def _is_mp3_frame(head: bytes) -> bool:
    """An MPEG audio frame header: 11 sync bits, a real version and a real layer (not ADTS)."""
    if len(head) < 3 or head[0] != 0xFF or head[1] & 0xE0 != 0xE0:
        return False
    version = (head[1] >> 3) & 0x03
    layer = (head[1] >> 1) & 0x03
    bitrate = head[2] >> 4
    rate = (head[2] >> 2) & 0x03
    return version != 1 and layer != 0 and bitrate != 0x0F and rate != 0x03


def sniff(data: bytes) -> MediaFormat | None:
    """The format ``data`` starts with, or None if not recognised."""
    head = bytes(data[:SNIFF_BYTES])
    if head.startswith(b"\xff\xd8\xff"):
        return JPEG
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return PNG
    if len(head) >= 12 and head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand == b"qt  ":
            return MOV
        if brand in _HEIF_BRANDS:
            return HEIF
        if brand in _M4A_BRANDS:
            return M4A
        return MP4
    if len(head) >= 12 and head.startswith(b"RIFF"):
        sub = head[8:12]
        if sub == b"AVI ":
            return AVI
        if sub == b"WAVE":
            return WAV
        if sub == b"WEBP":
            return WEBP
        return None
    if head.startswith(_ASF_GUID):
        return WMV
    if head.startswith(b"fLaC"):
        return FLAC
    if head.startswith(b"ID3") or _is_mp3_frame(head):
        return MP3
    if head.startswith((b"GIF87a", b"GIF89a")):
        return GIF
    if head.startswith(b"BM") and len(head) >= 14 and head[6:10] == b"\x00\x00\x00\x00":
        return BMP
    if head.startswith(b"OggS"):
        return OGG
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return MKV
    return None


def require_format(data: bytes, kind: MediaKind, index: int) -> MediaFormat:
    """The accepted format of ``data`` for a ``kind`` part, else MediaError 415 naming the part,
    what the content is, and what is accepted."""
    fmt = sniff(data)
    if fmt is not None and fmt.supported and fmt.kind == kind:
        return fmt
    accepted = ", ".join(f.name for f in SUPPORTED[kind])
    if not data:
        what = "content is empty"
    elif fmt is None:
        what = "content is not a recognised media format"
    else:
        what = f"content is {fmt.description}"
    raise MediaError(
        f"{where(index, kind)}: unsupported {kind} format: {what} (accepted: {accepted})", 415
    )

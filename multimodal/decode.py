"""Raw bytes -> decoded media, each size checked from the header before the expensive work.

- images (Pillow, JPEG/PNG plugins only): width x height checked before pixels are decoded.
- videos (PyAV, demuxer forced from the sniffed format): frame size, frame count and duration
  checked before decoding; ``num_frames`` frames sampled evenly.
- audio (soundfile/libsndfile: WAV, FLAC, MP3): sample rate, channels and duration checked
  before decoding; decoded in blocks, mixed to mono and resampled (PyAV's swresample).

These functions are CPU-bound and synchronous: run them in an executor, never on the IO loop.
Every failure is a MediaError naming the part (413 over a limit, 415 wrong format, 422 corrupt).
"""
from __future__ import annotations

import io
import logging
import warnings

import av
import numpy as np
import soundfile as sf
from PIL import Image, ImageOps

from mindie_service.errors import MediaError

from .budget import DecodedBudget
from .policy import MediaPolicy, where
from .sniff import require_format
from .spool import MediaBytes

logger = logging.getLogger(__name__)

# Audio is decoded and resampled this many source frames at a time.
_AUDIO_BLOCK_FRAMES = 65536


# ---------------------------------------------------------------------------------------------
# Images


def check_shape(w: str, width: int, height: int, policy: MediaPolicy, what: str) -> None:
    """Aspect ratio of an image or video frame: a 200000x1 PNG is 661 bytes and 200,000 pixels, but a
    shortest-edge resize makes it millions."""
    if max(width, height) > policy.max_aspect_ratio * min(width, height):
        raise MediaError(f"{w}: {what} is {width}x{height}, an aspect ratio over the limit of "
                         f"{policy.max_aspect_ratio:g}:1", 413)


def resized_pixels(width: int, height: int, shortest_edge: int) -> int:
    """Pixels after a shortest-edge resize (CLIP, LLaVA): the short side becomes ``shortest_edge``."""
    short, long = min(width, height), max(width, height)
    return shortest_edge * -(-long * shortest_edge // short)


def decode_image(data: bytes, index: int, policy: MediaPolicy, budget: DecodedBudget | None = None,
                 resize_shortest_edge: int | None = None) -> Image.Image:
    """An RGB image. The pixel count, aspect ratio, decoded bytes and (given the processor's shortest
    edge) the pixels after resizing are read from the header and checked before decoding."""
    w = where(index, "image")
    fmt = require_format(data, "image", index)
    try:
        with warnings.catch_warnings():
            # Our own pixel check below is the limit; Pillow's global one must not warn or
            # raise first with its own wording.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=[fmt.pil] if fmt.pil else None)
            width, height = image.size
            if width <= 0 or height <= 0:
                raise MediaError(f"{w}: the image has no pixels ({width}x{height})", 422)
            if width * height > policy.max_image_pixels:
                raise MediaError(
                    f"{w}: the image is {width}x{height} = {width * height} pixels, over the "
                    f"limit of {policy.max_image_pixels}", 413)
            check_shape(w, width, height, policy, "the image")
            if resize_shortest_edge:
                resized = resized_pixels(width, height, resize_shortest_edge)
                if resized > policy.max_image_pixels:
                    raise MediaError(f"{w}: the image is {width}x{height}; resized for the model it would be "
                                     f"{resized} pixels, over the limit of {policy.max_image_pixels}", 413)
            if budget is not None:
                budget.take(width * height * 3, index, "image", "the image")
                if resize_shortest_edge:  # the processor's float32 copy
                    budget.take(resized * 3 * 4, index, "image", "the image resized for the model")
            image.load()
            ImageOps.exif_transpose(image, in_place=True)  # no second copy of the pixels
            if image.mode != "RGB":
                image = image.convert("RGB")
            return image
    except MediaError:
        raise
    except Image.DecompressionBombError:
        # Pillow's own guard (2 x Image.MAX_IMAGE_PIXELS) fired while reading the header.
        raise MediaError(
            f"{w}: the image has too many pixels (limit {policy.max_image_pixels})", 413
        ) from None
    except (OSError, SyntaxError, ValueError, EOFError, Image.UnidentifiedImageError) as e:
        logger.info("inputs[%d]: image decode failed: %s", index, type(e).__name__)
        raise MediaError(f"{w}: the {fmt.name} image is truncated or corrupt", 422) from None


# ---------------------------------------------------------------------------------------------
# Videos


def sample_indices(total_frames: int, num_frames: int) -> list[int]:
    """``num_frames`` frame indices spread evenly over ``total_frames`` (first and last
    included): ``numpy.linspace(0, total_frames - 1, num_frames).round()``."""
    if total_frames <= 0 or num_frames <= 0:
        return []
    return [int(i) for i in np.linspace(0, total_frames - 1, num_frames).round()]


def _open_video(data: bytes | MediaBytes, demuxer: str | None) -> av.container.InputContainer:
    """PyAV reads a spooled or local video from its file, never from a copy in memory."""
    source = data.open() if isinstance(data, MediaBytes) else io.BytesIO(data)
    return av.open(source, mode="r", format=demuxer)


def _count_frames(data: bytes | MediaBytes, demuxer: str | None, limit: int, w: str) -> int:
    """Frame count by demuxing packets (no decoding), for containers that do not report it."""
    count = 0
    with _open_video(data, demuxer) as container:
        stream = container.streams.video[0]
        for packet in container.demux(stream):
            if packet.size:
                count += 1
                if count > limit:
                    raise MediaError(f"{w}: the video has more than {limit} frames", 413)
    return count


def decode_video(data: bytes | MediaBytes, index: int, policy: MediaPolicy, num_frames: int,
                 budget: DecodedBudget | None = None) -> list[np.ndarray]:
    """``num_frames`` RGB frames (H x W x 3 uint8) sampled evenly over the video (``data``: its bytes, or a
    ``MediaBytes`` whose file PyAV reads directly)."""
    w = where(index, "video")
    if num_frames <= 0:
        raise ValueError("num_frames must be positive")
    fmt = require_format(data.head if isinstance(data, MediaBytes) else data, "video", index)
    try:
        with _open_video(data, fmt.demuxer) as container:
            if not container.streams.video:
                raise MediaError(f"{w}: the file has no video stream", 422)
            stream = container.streams.video[0]
            ctx = stream.codec_context
            if ctx is None:  # a truncated file: the stream is listed but its codec was never read
                raise MediaError(f"{w}: the {fmt.name} video is truncated or corrupt (no codec)", 422)
            width, height = int(ctx.width or 0), int(ctx.height or 0)
            if width * height > policy.max_image_pixels:
                raise MediaError(
                    f"{w}: video frames are {width}x{height} = {width * height} pixels, over "
                    f"the limit of {policy.max_image_pixels}", 413)
            seconds = _video_seconds(container, stream)
            if seconds is not None and seconds > policy.max_video_seconds:
                raise MediaError(
                    f"{w}: the video is {seconds:.1f} s long, over the limit of "
                    f"{policy.max_video_seconds:g} s", 413)
            total = int(stream.frames or 0)
            if total > policy.max_video_frames_total:
                raise MediaError(
                    f"{w}: the video has {total} frames, over the limit of "
                    f"{policy.max_video_frames_total}", 413)
        if total <= 0:
            total = _count_frames(data, fmt.demuxer, policy.max_video_frames_total, w)
        if total <= 0:
            raise MediaError(f"{w}: the video has no frames", 422)
        if width > 0 and height > 0:
            check_shape(w, width, height, policy, "a video frame")
            if budget is not None:
                budget.take(num_frames * width * height * 3, index, "video", f"{num_frames} sampled frames")
        wanted = sample_indices(total, num_frames)
        if max(wanted) < policy.max_video_frames_decoded:
            return _decode_frames(data, fmt.demuxer, wanted, policy, w)
        return _decode_seeking(data, fmt.demuxer, wanted, policy, w)  # a long video: never decode it all
    except MediaError:
        raise
    except (av.FFmpegError, OSError, ValueError, IndexError, EOFError, AttributeError, TypeError,
            ZeroDivisionError) as e:
        logger.info("inputs[%d]: video decode failed: %s", index, type(e).__name__)
        raise MediaError(f"{w}: the {fmt.name} video is truncated or corrupt", 422) from None


def _decode_seeking(data: bytes | MediaBytes, demuxer: str | None, wanted: list[int], policy: MediaPolicy,
                    w: str) -> list[np.ndarray]:
    """Each wanted frame by seeking to the keyframe before it and decoding forward; at most
    ``max_video_frames_decoded`` frames decoded in all (sparse keyframes -> 413)."""
    cap, decoded, picks = policy.max_video_frames_decoded, 0, []
    with _open_video(data, demuxer) as container:
        stream = container.streams.video[0]
        rate, tb = stream.average_rate or stream.guessed_rate, stream.time_base
        if not rate or not tb:
            raise MediaError(f"{w}: the video has no frame rate to seek by and more than {cap} frames to "
                             f"decode (ServerConfig.maxVideoFramesDecoded)", 413)
        start = stream.start_time or 0
        for idx in wanted:
            target = start + int(idx / (rate * tb))
            container.seek(target, stream=stream, backward=True, any_frame=False)
            got: av.VideoFrame | None = None
            for frame in container.decode(stream):
                decoded += 1
                if decoded > cap:
                    raise MediaError(f"{w}: sampling the video needs more than {cap} frames decoded (keyframes "
                                     f"too sparse; ServerConfig.maxVideoFramesDecoded)", 413)
                if frame.width * frame.height > policy.max_image_pixels:
                    raise MediaError(f"{w}: a video frame is {frame.width}x{frame.height} pixels, over the "
                                     f"limit of {policy.max_image_pixels}", 413)
                got = frame
                if frame.pts is None or frame.pts >= target:
                    break
            if got is None:
                raise MediaError(f"{w}: no video frame could be decoded near frame {idx}", 422)
            picks.append(got.to_ndarray(format="rgb24"))
    return picks


def _video_seconds(container: av.container.InputContainer, stream: av.VideoStream) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / av.time_base
    return None


def _decode_frames(data: bytes | MediaBytes, demuxer: str | None, wanted: list[int], policy: MediaPolicy,
                   w: str) -> list[np.ndarray]:
    """Decode sequentially up to the last wanted index, converting only the wanted frames.
    If the stream ends early (its header over-counted), missing picks repeat the last frame."""
    picks: dict[int, np.ndarray] = {}
    wanted_set = set(wanted)
    last_index = max(wanted)
    last_frame: av.VideoFrame | None = None
    decoded = 0
    with _open_video(data, demuxer) as container:
        stream = container.streams.video[0]
        for i, frame in enumerate(container.decode(stream)):
            if frame.width * frame.height > policy.max_image_pixels:
                raise MediaError(
                    f"{w}: a video frame is {frame.width}x{frame.height} pixels, over the "
                    f"limit of {policy.max_image_pixels}", 413)
            decoded = i + 1
            last_frame = frame
            if i in wanted_set:
                picks[i] = frame.to_ndarray(format="rgb24")
            if i >= last_index:
                break
    if last_frame is None:
        raise MediaError(f"{w}: no video frame could be decoded", 422)
    if decoded <= last_index:
        logger.debug("video stream ended at frame %d, header promised more", decoded)
        tail = last_frame.to_ndarray(format="rgb24")
        return [picks.get(i, tail) for i in wanted]
    return [picks[i] for i in wanted]


# ---------------------------------------------------------------------------------------------
# Audio


def _resampler(rate: int) -> av.AudioResampler:
    return av.AudioResampler(format="flt", layout="mono", rate=rate)


def _resample_block(resampler: av.AudioResampler, mono: np.ndarray | None,
                    source_rate: int) -> list[np.ndarray]:
    if mono is None:
        frames = resampler.resample(None)
    else:
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(mono, dtype=np.float32)[np.newaxis, :], format="flt",
            layout="mono")
        frame.sample_rate = source_rate
        frames = resampler.resample(frame)
    return [f.to_ndarray().reshape(-1) for f in frames]


def decode_audio(data: bytes, index: int, policy: MediaPolicy, sampling_rate: int,
                 budget: DecodedBudget | None = None) -> np.ndarray:
    """Mono float32 samples at ``sampling_rate``. Sample rate, channel count and duration are
    checked from the header before decoding; decoding never reads past the duration limit."""
    w = where(index, "audio")
    if sampling_rate <= 0:
        raise ValueError("sampling_rate must be positive")
    fmt = require_format(data, "audio", index)
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            rate, channels, frames = int(f.samplerate), int(f.channels), int(f.frames)
            if rate <= 0 or rate > policy.max_audio_sample_rate:
                raise MediaError(
                    f"{w}: sample rate {rate} Hz is outside 1..{policy.max_audio_sample_rate}",
                    413 if rate > 0 else 422)
            if channels <= 0 or channels > policy.max_audio_channels:
                raise MediaError(
                    f"{w}: {channels} channels, outside 1..{policy.max_audio_channels}",
                    413 if channels > 0 else 422)
            max_frames = int(policy.max_audio_seconds * rate)
            if frames > max_frames:
                raise MediaError(
                    f"{w}: the audio is {frames / rate:.1f} s long, over the limit of "
                    f"{policy.max_audio_seconds:g} s", 413)
            if budget is not None:  # float32 samples at the model's rate (the read below never passes max_frames)
                budget.take((min(frames, max_frames) * sampling_rate // rate + 1) * 4, index, "audio", "the audio")
            out: list[np.ndarray] = []
            resampler = _resampler(sampling_rate) if rate != sampling_rate else None
            read = 0
            # Headers can lie (MP3 lengths are estimates): never read more than the limit.
            while True:
                block = f.read(min(_AUDIO_BLOCK_FRAMES, max_frames + 1 - read), dtype="float32",
                               always_2d=True)
                if block.shape[0] == 0:
                    break
                read += block.shape[0]
                if read > max_frames:
                    raise MediaError(
                        f"{w}: the audio is over the limit of {policy.max_audio_seconds:g} s",
                        413)
                mono = block.mean(axis=1, dtype=np.float32) if channels > 1 else block[:, 0]
                if resampler is None:
                    out.append(mono.copy())
                else:
                    out.extend(_resample_block(resampler, mono, rate))
            if resampler is not None and read:
                out.extend(_resample_block(resampler, None, rate))
    except MediaError:
        raise
    except (sf.LibsndfileError, RuntimeError, av.FFmpegError, OSError, ValueError) as e:
        logger.info("inputs[%d]: audio decode failed: %s", index, type(e).__name__)
        raise MediaError(f"{w}: the {fmt.name} audio is truncated or corrupt", 422) from None
    if not out:
        raise MediaError(f"{w}: the audio has no samples", 422)
    return np.concatenate(out).astype(np.float32, copy=False)

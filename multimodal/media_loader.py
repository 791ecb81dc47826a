"""MindIE list-form ``inputs`` -> validated parts -> fetched and decoded media.

``parse_parts`` (parts.py) checks the shape (no I/O); ``load_media`` fetches every media part
concurrently on the IO loop (sources.py guards) and decodes each in the given executor as soon as
its bytes arrive. Every model's processor goes through this one loader."""
from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from mindie_service.errors import MediaError

from .decode import decode_audio, decode_image, decode_video
from .parts import MediaItem, Part, PartKind, TextPart, parse_parts
from .budget import DecodedBudget
from .policy import MediaKind, MediaPolicy, where
from .sniff import sniff
from .sources import ByteBudget, fetch_media
from .spool import MediaBytes

__all__ = ["DecodeOptions", "LoadedPart", "MediaItem", "Part", "TextPart", "load_media", "parse_parts"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecodeOptions:
    """What the model's processor wants: frames sampled per video, audio sample rate."""

    num_video_frames: int = 8
    audio_sampling_rate: int = 16000
    resize_shortest_edge: int | None = None  # the image processor's shortest-edge resize, when it has one

    def __post_init__(self) -> None:
        if self.num_video_frames <= 0:
            raise ValueError("DecodeOptions.num_video_frames must be positive")
        if self.audio_sampling_rate <= 0:
            raise ValueError("DecodeOptions.audio_sampling_rate must be positive")


@dataclass(frozen=True, eq=False)
class LoadedPart:
    """One element of ``inputs``, ready for a processor, in the original order.

    ``payload``: ``str`` (text), RGB ``PIL.Image.Image`` (image), ``list`` of H x W x 3 uint8
    ``numpy`` arrays (video), mono float32 ``numpy`` array at the requested rate (audio).
    ``sha256``: hex digest of the raw bytes (UTF-8 for text), for prefix-cache keys.
    ``format``: the sniffed container format (``png``, ``mp4``, ``wav``...), None for text.
    """

    index: int
    kind: PartKind
    payload: Any
    sha256: str
    format: str | None = None
    nbytes: int = 0


def _decode_and_hash(data: bytes | MediaBytes, item_kind: MediaKind, index: int, policy: MediaPolicy,
                     options: DecodeOptions, budget: DecodedBudget | None = None
                     ) -> tuple[Any, str, str | None] | tuple[str, int]:
    """Executor side: decode and hash (hashing 512 MB takes a while too), then close ``data`` (a spooled
    video's temporary file goes). A MediaError comes back as ``(message, status)``. Whatever else a
    decoder raises on hostile bytes is this part's 422, never the server's 500."""
    blob = data if isinstance(data, MediaBytes) else MediaBytes(data)
    with blob:
        return _decode_blob(blob, item_kind, index, policy, options, budget)


def _decode_blob(data: MediaBytes, item_kind: MediaKind, index: int, policy: MediaPolicy,
                 options: DecodeOptions, budget: DecodedBudget | None) -> tuple[Any, str, str | None] | tuple[str, int]:
    try:
        if item_kind == "video":
            payload = decode_video(data if data.on_disk else data.data, index, policy,  # type: ignore[arg-type]
                                   options.num_video_frames, budget)
        elif data.data is None:  # only videos are spooled (MediaPolicy.spool_threshold)
            raise MediaError(f"{where(index, item_kind)}: the {item_kind} is too large", 413)
        elif item_kind == "image":
            payload = decode_image(data.data, index, policy, budget, options.resize_shortest_edge)
        else:
            payload = decode_audio(data.data, index, policy, options.audio_sampling_rate, budget)
    except MediaError as e:
        return e.message, e.status
    except MemoryError:
        logger.warning("inputs[%d]: out of memory decoding a %s", index, item_kind)
        return f"{where(index, item_kind)}: too large to decode", 413
    except Exception:  # noqa: BLE001 - a decoder bug on hostile input: logged, answered as this part's error
        logger.exception("inputs[%d]: %s decoder failed", index, item_kind)
        return f"{where(index, item_kind)}: the {item_kind} could not be decoded", 422
    fmt = sniff(data.head)
    return payload, data.sha256(), fmt.name if fmt else None


async def _load_one(item: MediaItem, policy: MediaPolicy, executor: Executor,
                    options: DecodeOptions, budget: ByteBudget, decoded: DecodedBudget) -> LoadedPart:
    data = await fetch_media(item.ref, item.kind, item.index, policy, budget=budget, spool=True)
    blob = data if isinstance(data, MediaBytes) else MediaBytes(data)
    # The decode closes the blob when it ends; one cancelled before it ever ran is closed here.
    work = executor.submit(_decode_and_hash, blob, item.kind, item.index, policy, options, decoded)
    try:
        result = await asyncio.wrap_future(work)
    except asyncio.CancelledError:
        if work.cancel():
            blob.close()
        raise
    if len(result) == 2:
        message, status = result  # type: ignore[misc]
        raise MediaError(message, status)
    payload, digest, fmt = result  # type: ignore[misc]
    return LoadedPart(item.index, item.kind, payload, digest, fmt, blob.size)


async def load_media(parts: Sequence[Part], policy: MediaPolicy, executor: Executor,
                     options: DecodeOptions | None = None) -> list[LoadedPart]:
    """Fetch all media parts concurrently, decode each in ``executor``; text parts pass
    through. Returns one LoadedPart per part, in order. On the first failure the other
    fetches are cancelled and the failure of the lowest-numbered part is raised."""
    options = options or DecodeOptions()
    budget = ByteBudget(policy.max_request_bytes)
    decoded = DecodedBudget(policy.max_decoded_bytes)  # the per-request media budget, all items together
    tasks: dict[int, asyncio.Task[LoadedPart]] = {}
    for part in parts:
        if isinstance(part, MediaItem):
            tasks[part.index] = asyncio.ensure_future(
                _load_one(part, policy, executor, options, budget, decoded))
    try:
        if tasks:
            done, pending = await asyncio.wait(tasks.values(),
                                               return_when=asyncio.FIRST_EXCEPTION)
            if pending:  # something failed
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
    except BaseException:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        raise
    failures = [(i, t.exception()) for i, t in sorted(tasks.items())
                if not t.cancelled() and t.exception() is not None]
    if failures:
        raise failures[0][1]  # type: ignore[misc]
    loaded: list[LoadedPart] = []
    for part in parts:
        if isinstance(part, TextPart):
            raw = part.text.encode("utf-8")
            loaded.append(LoadedPart(part.index, "text", part.text,
                                     hashlib.sha256(raw).hexdigest(), None, len(raw)))
        else:
            loaded.append(tasks[part.index].result())
    logger.debug("loaded %d media parts (%d bytes)", len(tasks), budget.used)
    return loaded

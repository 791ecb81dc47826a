"""A batch job's input file, read through the guard (``mindie_service.netguard``) with the jobs' own limits.

``prompt_file_path`` is a seed ``Path``: ``raw_bytes`` (base64 in the request), ``filepath`` (a server path
under the allowed media folders or ``batchJobsDir``), or ``uri``: a ``data:`` URI, an http(s) URL (one
checked lookup, pinned connect, no redirects, timeouts, the byte cap while streaming) or a ``file:`` URI /
path under the allowed media folders. Every refusal is a 4xx naming ``prompt_file_path``."""
from __future__ import annotations

import base64
import binascii
import logging
import os
from dataclasses import dataclass
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit

from mindie_service.errors import ValidationError
from mindie_service.jobs.spec import PathSpec, decode_raw
from mindie_service.netguard import FetchPolicy, PathLimits, UrlLimits, lexical_path, read_regular

logger = logging.getLogger(__name__)

MAX_INPUT_BYTES = 1 << 30  # an input file's bytes (lines are bounded by batchMaxLines too)
READ_TIMEOUT_FACTOR = 20  # a large input file takes longer than a media item: 20 x the media read timeout
CAP_NAME = "input file"
LABEL = "prompt_file_path.value"

RunBlocking = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class JobInputLimits:
    """Where a job's input may come from: ``files`` for the ``filepath`` type (media folders and the jobs
    folder), ``uri_files`` for ``file:`` URIs and paths given as ``uri`` (media folders only), ``url`` for
    http(s). Each carries the input cap."""

    files: PathLimits
    uri_files: PathLimits
    url: UrlLimits

    @classmethod
    def build(cls, policy: FetchPolicy, jobs_dir: str, max_bytes: int = MAX_INPUT_BYTES) -> JobInputLimits:
        """The server's outbound rules (``policy``: folders, hosts, private addresses, timeouts) with the
        input file's own cap and a longer read timeout."""
        roots = policy.allowed_local_paths
        return cls(
            files=PathLimits((*roots, jobs_dir), max_bytes, CAP_NAME, "ServerConfig.allowedLocalMediaPaths or batchJobsDir"),
            uri_files=policy.path_limits(max_bytes, CAP_NAME, "ServerConfig.allowedLocalMediaPaths"),
            url=policy.url_limits(max_bytes, CAP_NAME, read_timeout=policy.read_timeout * READ_TIMEOUT_FACTOR))


def _data_uri(ref: str, max_bytes: int) -> bytes:
    head, _, payload = ref.partition(",")
    if not head.endswith(";base64"):
        raise ValidationError("Parameter prompt_file_path.value must be a base64 data: URI")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError("Parameter prompt_file_path.value must be a base64 data: URI") from None
    if len(data) > max_bytes:
        raise ValidationError(f"Parameter prompt_file_path must be at most {max_bytes} bytes, got {len(data)}")
    return data


def _check_absolute(ref: str, files: PathLimits) -> None:
    """A relative ``filepath`` is refused saying so and which folders an input file may be in (their config
    keys: the folders themselves are not told to clients)."""
    if ref and not os.path.isabs(ref) and "\x00" not in ref:
        raise ValidationError(f"{LABEL}: a filepath must be absolute, naming a file inside {files.roots_hint} "
                              f"(a relative path is not resolved), got {ref[:200]!r}")


async def read_job_input(path: PathSpec, limits: JobInputLimits, run_blocking: RunBlocking) -> bytes:
    """The input file's bytes; file reads run through ``run_blocking`` (off the IO loop)."""
    if path.type == "raw_bytes":
        return decode_raw(path, limits.files.max_bytes)
    ref = path.value
    if path.type == "filepath":
        _check_absolute(ref, limits.files)
        return await run_blocking(read_regular, lexical_path(ref, False, limits.files, LABEL), limits.files, LABEL)
    if ref.startswith("data:"):
        return _data_uri(ref, limits.url.max_bytes)
    scheme = urlsplit(ref).scheme
    if scheme in ("http", "https"):
        from mindie_service.netguard import BytesSink, check_url, pinned_get  # Tornado's client only when a URL is given

        target = await check_url(ref, limits.url, LABEL)
        sink = BytesSink()
        await pinned_get(target, limits.url, LABEL, sink)
        return bytes(sink.data)
    raw = lexical_path(ref, scheme == "file", limits.uri_files, LABEL)
    return await run_blocking(read_regular, raw, limits.uri_files, LABEL)

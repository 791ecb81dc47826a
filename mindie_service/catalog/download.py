"""Fetching a model into the catalog: an http(s) URL of a .tar / .tar.gz / .zip of a checkpoint folder (or of
each file in ``assets``), or a local path under the allowed folders.

The media layer's guards apply: one DNS resolution checked against private/loopback/metadata addresses and
pinned for the connection, no redirects, connect/read timeouts, a byte cap (checked on Content-Length and
while streaming to disk, never holding the body in memory). Archive entries must stay inside the folder:
no absolute paths, no ``..``, no links or devices. Everything is written to a staging folder beside the
model's and moved into place only when complete, so a failed download leaves no half model."""
from __future__ import annotations

import logging
import os
import shutil
import stat
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable
from urllib.parse import urlsplit

from tornado.httpclient import HTTPRequest
from tornado.simple_httpclient import SimpleAsyncHTTPClient

from mindie_service.errors import MediaError, ValidationError
from multimodal import MediaPolicy
from multimodal.netfetch import _PinnedResolver, resolve_checked
from multimodal.sources import local_path_of

logger = logging.getLogger(__name__)

ARCHIVES = (".tar", ".tar.gz", ".tgz", ".zip")
CHUNK = 1 << 20


@dataclass
class Progress:
    """What GET /v1/models/{id} shows while a download runs (metadata.download)."""

    bytes_done: int = 0
    bytes_total: int | None = None
    files: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"bytes_done": self.bytes_done, "bytes_total": self.bytes_total}


def _refuse(msg: str, status: int = 422, field: str = "source_url") -> MediaError:
    return MediaError(f"{field}: {msg}", status)


@dataclass(frozen=True)
class Source:
    """A checked source: an URL with its checked addresses, or a local path inside the allowed folders."""

    url: str | None = None
    host: str = ""
    addresses: tuple[tuple[int, str], ...] = ()
    path: Path | None = None


async def check_source(ref: str, policy: MediaPolicy, field: str = "source_url") -> Source:
    """The SSRF and path checks, before anything is fetched (the route answers their errors at once).
    ``field`` names the request field in error messages (batch jobs fetch their input file this way too)."""
    if not isinstance(ref, str) or not ref:
        raise ValidationError("Parameter source_url must be set in the model's model.json to download it")
    parts = urlsplit(ref)
    if parts.scheme in ("http", "https"):
        if "@" in parts.netloc or not parts.hostname:
            raise _refuse("the URL must name a host and carry no credentials", field=field)
        if not policy.host_allowed(parts.hostname):
            raise _refuse(f"the URL host {parts.hostname!r} is not in the allowed hosts", 403, field=field)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            addrs = await resolve_checked(parts.hostname, port, "image", 0, policy)
        except MediaError as e:
            raise _refuse(e.message.split(": ", 1)[-1], e.status, field=field) from None
        return Source(url=ref, host=parts.hostname, addresses=tuple(addrs))
    try:
        raw = local_path_of(ref, parts.scheme == "file", "image", 0, policy)
    except MediaError as e:
        raise _refuse(e.message.split(": ", 1)[-1], e.status, field=field) from None
    real = os.path.realpath(raw)
    if not any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in policy.allowed_local_paths):
        raise _refuse("the path is outside the allowed local folders (ServerConfig.allowedLocalMediaPaths)", 403,
                      field=field)
    if not os.path.exists(real):
        raise _refuse("the path does not exist", 404, field=field)
    return Source(path=Path(real))


async def fetch_to_file(src: Source, url: str, dest: Path, cap: int, policy: MediaPolicy, progress: Progress,
                        field: str = "source_url") -> None:
    """GET ``url`` (its host already checked) into ``dest``, streamed, at most ``cap`` bytes."""
    failure: list[MediaError] = []
    f = dest.open("wb")

    def on_header(line: str) -> None:
        if line.lower().startswith("content-length:"):
            n = int(line.split(":", 1)[1].strip() or 0)
            progress.bytes_total = (progress.bytes_total or 0) + n
            if n > cap:
                failure.append(_refuse(f"Content-Length {n} is over the cap of {cap} bytes", 413, field=field))
                raise OSError("over the cap")

    def on_chunk(chunk: bytes) -> None:
        progress.bytes_done += len(chunk)
        if progress.bytes_done > cap:
            failure.append(_refuse(f"the download is over the cap of {cap} bytes", 413, field=field))
            raise OSError("over the cap")
        f.write(chunk)

    client = SimpleAsyncHTTPClient(force_instance=True, resolver=_PinnedResolver(host=src.host, addresses=list(src.addresses)),
                                   max_clients=1, max_body_size=1 << 62)
    try:
        resp = await client.fetch(HTTPRequest(
            url, follow_redirects=False, connect_timeout=policy.connect_timeout,
            request_timeout=policy.connect_timeout + policy.read_timeout * 20, decompress_response=False,
            header_callback=on_header, streaming_callback=on_chunk), raise_error=False)
    except Exception as e:  # noqa: BLE001 - every transport failure becomes the model's error
        if failure:
            raise failure[0] from None
        raise _refuse(f"fetching the URL failed ({type(e).__name__})", field=field) from None
    finally:
        f.close()
        client.close()
    if failure:
        raise failure[0]
    if resp.code != 200:
        raise _refuse(f"the URL answered HTTP {resp.code}, not 200 (redirects are not followed)", field=field)


def _member_ok(name: str) -> bool:
    n = name.replace("\\", "/")
    if not n or n.startswith("/") or (len(n) > 1 and n[1] == ":"):  # absolute, or a drive letter
        return False
    return ".." not in PurePosixPath(n).parts


def extract(archive: Path, out: Path, cap: int) -> None:
    """Extract a .tar[.gz] or .zip into ``out``: regular files and folders only, every path inside ``out``,
    at most ``cap`` bytes uncompressed. ValidationError names the first bad entry; nothing is kept then."""
    total = 0
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                mode = info.external_attr >> 16
                if not _member_ok(info.filename) or stat.S_ISLNK(mode):
                    raise ValidationError(f"the archive entry {info.filename!r} would leave the model's folder "
                                          "(absolute path, '..' or a link)")
                total += info.file_size
            if total > cap:
                raise _refuse(f"the archive holds {total} bytes uncompressed, over the cap of {cap}", 413)
            z.extractall(out)
        return
    with tarfile.open(archive, "r:*") as t:
        members = t.getmembers()
        for m in members:
            if not _member_ok(m.name) or not (m.isfile() or m.isdir()):
                raise ValidationError(f"the archive entry {m.name!r} would leave the model's folder "
                                      "(absolute path, '..', a link or a device)")
            total += m.size
        if total > cap:
            raise _refuse(f"the archive holds {total} bytes uncompressed, over the cap of {cap}", 413)
        t.extractall(out, members=members, filter="data")


def checkpoint_root(folder: Path) -> Path:
    """The folder holding config.json: the staging folder itself or its single top-level folder."""
    if (folder / "config.json").is_file():
        return folder
    subs = [p for p in folder.iterdir() if p.is_dir()]
    if len(subs) == 1 and (subs[0] / "config.json").is_file():
        return subs[0]
    raise ValidationError("the downloaded model holds no config.json (a Hugging Face checkpoint folder)")


def move_into_place(staged: Path, target: Path, keep: Callable[[Path], None]) -> None:
    """Replace ``target`` by ``staged`` (renames on one filesystem); ``keep`` copies what the old folder had
    that the new one must keep (its model.json)."""
    keep(staged)
    old = target.with_name(f".{target.name}.old")
    if target.exists():
        os.replace(target, old)
    os.replace(staged, target)
    shutil.rmtree(old, ignore_errors=True)

"""Fetching a model into the catalog: an http(s) URL of a .tar / .tar.gz / .zip of a checkpoint folder, of one
``.gguf`` file (a GGUF model), or of each file in ``assets``; or a local path (a folder, an archive, a ``.gguf``
file) under the allowed folders.

The guard (``mindie_service.netguard``) applies, with the downloader's own limits (``download_limits``, from the
server's ``FetchPolicy``): one DNS resolution
checked against private/loopback/metadata addresses and pinned for the connection, no redirects,
connect/read timeouts, a byte cap (checked on Content-Length and while streaming to disk, never holding the
body in memory); a local source must lie in the allowed folders after symlinks are resolved. Archive entries must stay inside the folder:
no absolute paths, no ``..``, no links or devices. Everything is written to a staging folder beside the
model's and moved into place only when complete, so a failed download leaves no half model."""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import stat
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Callable
from urllib.parse import unquote, urlsplit

from mindie_service.catalog.checkpoint_kind import detect
from mindie_service.errors import MediaError, ValidationError
from mindie_service.netguard import (CheckedURL, FetchPolicy, PathLimits, UrlLimits, check_url, lexical_path,
                                     pinned_get, real_path_inside)

logger = logging.getLogger(__name__)

ARCHIVES = (".tar", ".tar.gz", ".tgz", ".zip")
GGUF_SUFFIX = ".gguf"
CHUNK = 1 << 20
READ_TIMEOUT_FACTOR = 20  # weights take longer than a media item: 20 x the media read timeout
ROOTS_HINT = "ServerConfig.allowedLocalMediaPaths"


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


def download_limits(policy: FetchPolicy, cap: int) -> UrlLimits:
    """The downloader's limits: the server's outbound rules (hosts, private addresses, timeouts) with the
    download's own cap and a longer read timeout."""
    return policy.url_limits(cap, "download", read_timeout=policy.read_timeout * READ_TIMEOUT_FACTOR)


def source_path_limits(policy: FetchPolicy) -> PathLimits:
    """The folders a local source may lie in (the server's allowed local folders)."""
    return policy.path_limits(0, "download", roots_hint=ROOTS_HINT)


@dataclass(frozen=True)
class Source:
    """A checked source: an URL with its checked addresses, or a local path inside the allowed folders."""

    url: str | None = None
    host: str = ""
    addresses: tuple[tuple[int, str], ...] = ()
    path: Path | None = None


async def check_source(ref: str, policy: FetchPolicy, field: str = "source_url") -> Source:
    """The SSRF and path checks, before anything is fetched (the route answers their errors at once).
    ``field`` names the request field in error messages."""
    if not isinstance(ref, str) or not ref:
        raise ValidationError("Parameter source_url must be set in the model's model.json to download it")
    scheme = urlsplit(ref).scheme
    if scheme in ("http", "https"):
        target = await check_url(ref, download_limits(policy, 0), field)
        return Source(url=ref, host=target.host, addresses=target.addresses)
    limits = source_path_limits(policy)
    real = real_path_inside(lexical_path(ref, scheme == "file", limits, field), limits, field)
    if not os.path.exists(real):
        raise _refuse("the path does not exist", 404, field=field)
    return Source(path=Path(real))


class _FileSink:
    """The guarded body written to a file as it arrives, counted in the download's progress."""

    def __init__(self, f: BinaryIO, progress: Progress) -> None:
        self.f, self.progress = f, progress

    def expect(self, length: int) -> None:
        self.progress.bytes_total = (self.progress.bytes_total or 0) + length

    def write(self, chunk: bytes) -> None:
        self.progress.bytes_done += len(chunk)
        self.f.write(chunk)


async def fetch_to_file(src: Source, url: str, dest: Path, cap: int, policy: FetchPolicy, progress: Progress,
                        field: str = "source_url") -> None:
    """GET ``url`` (its host already checked: ``src``) into ``dest``, streamed, at most ``cap`` bytes."""
    limits = download_limits(policy, cap)
    with dest.open("wb") as f:
        await pinned_get(CheckedURL(url, src.host, 0, src.addresses), limits, field, _FileSink(f, progress))


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
    """The folder holding the checkpoint (config.json, or a .gguf file without one): the staging folder itself
    or its single top-level folder."""
    if detect(folder) is not None:
        return folder
    subs = [p for p in folder.iterdir() if p.is_dir()]
    if len(subs) == 1 and detect(subs[0]) is not None:
        return subs[0]
    raise ValidationError("the downloaded model holds no checkpoint: neither config.json (a Hugging Face "
                          "checkpoint folder) nor a .gguf file")


def _file_name(ref: str, field: str) -> str:
    """The plain file name an URL (its path, decoded) or an asset ends with; ValidationError for anything else."""
    path = unquote(urlsplit(ref).path) if ref.startswith(("http://", "https://")) else ref
    name = path.rsplit("/", 1)[-1]
    if not name or name in (".", "..") or "\\" in name or name.startswith(".") or "\0" in name:
        raise ValidationError(f"{field}: {ref!r} does not end with a file name")
    return name


def _is(ref: str, suffixes: tuple[str, ...] | str) -> bool:
    return urlsplit(ref).path.lower().endswith(suffixes) if "://" in ref else ref.lower().endswith(suffixes)


async def fetch_into(model_id: str, assets: list[str], src: Source, staging: Path, cap: int, policy: FetchPolicy,
                     prog: Progress) -> None:
    """Fetch a checked source into ``staging`` (an empty folder): a folder or archive as its files, a ``.gguf``
    as that one file, an URL of neither as each file of ``assets``. At most ``cap`` bytes in all."""
    loop = asyncio.get_running_loop()
    ref = src.url or str(src.path)
    if src.path is not None:
        await loop.run_in_executor(None, _copy_local, src.path, staging, cap, policy, prog)
        return
    assert src.url is not None
    if _is(ref, ARCHIVES):
        part = staging.parent / f".{model_id}.download"
        try:
            await fetch_to_file(src, src.url, part, cap, policy, prog)
            await loop.run_in_executor(None, extract, part, staging, cap)
        finally:
            part.unlink(missing_ok=True)
        return
    if _is(ref, GGUF_SUFFIX):  # one GGUF file is the whole model
        await fetch_to_file(src, src.url, staging / _file_name(src.url, "source_url"), cap, policy, prog)
        return
    if not assets:
        raise ValidationError("source_url: an URL that is neither an archive nor a .gguf file needs the files "
                              "listed in assets")
    base = src.url.rstrip("/")
    for a in assets:
        name = _file_name(a, "assets")
        url = a if a.startswith(("http://", "https://")) else f"{base}/{name}"
        asrc = src if url.startswith(base + "/") else await check_source(url, policy, field="assets")
        await fetch_to_file(asrc, url, staging / name, cap - prog.bytes_done, policy, prog, field="assets")


def _copy_local(path: Path, staging: Path, cap: int, policy: FetchPolicy, prog: Progress) -> None:
    """A local source (already checked to lie in the allowed folders): a folder copied (its links followed only
    where they resolve inside the allowed folders, as a Hugging Face cache snapshot's do), an archive
    extracted, a ``.gguf`` file copied; ``prog`` counts the bytes copied (an archive's once extracted)."""
    if path.is_dir():
        prog.bytes_total = _check_folder(path, cap, source_path_limits(policy))
        shutil.copytree(path, staging / "ckpt", symlinks=False,
                        copy_function=lambda src, dst: _copy_counted(src, dst, prog))
    elif _is(path.name, ARCHIVES):
        prog.bytes_total = path.stat().st_size
        extract(path, staging, cap)
        prog.bytes_done = prog.bytes_total
    elif _is(path.name, GGUF_SUFFIX):
        size = path.stat().st_size
        if size > cap:
            raise _refuse(f"the file holds {size} bytes, over the cap of {cap}", 413)
        prog.bytes_total = size
        _copy_counted(path, staging / path.name, prog)
    else:
        raise ValidationError("source_url: a local source must be a folder, a .tar/.tar.gz/.zip archive or a "
                              ".gguf file")


def _copy_counted(src: str | Path, dst: str | Path, prog: Progress) -> None:
    """``shutil.copy2`` in CHUNK pieces, each counted in ``prog.bytes_done`` as it is written."""
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        while chunk := fi.read(CHUNK):
            fo.write(chunk)
            prog.bytes_done += len(chunk)
    shutil.copystat(src, dst)


def _check_folder(folder: Path, cap: int, limits: PathLimits) -> int:
    """Every entry of ``folder``, links resolved, lies in the allowed folders, is a folder or a regular file, and
    the files hold at most ``cap`` bytes in all (returned); a linked folder seen twice (a cycle) is refused."""
    total, seen = 0, set()
    for top, dirs, files in os.walk(folder, followlinks=True):
        real = real_path_inside(top, limits, f"source_url entry {top}")
        if real in seen:
            raise ValidationError(f"source_url: the folder {top} links back into itself")
        seen.add(real)
        for name in files:
            entry = os.path.join(top, name)
            st = os.stat(real_path_inside(entry, limits, f"source_url entry {entry}"))
            if not stat.S_ISREG(st.st_mode):
                raise ValidationError(f"source_url: {entry} is neither a folder nor a regular file")
            total += st.st_size
        if total > cap:
            raise _refuse(f"the folder holds more than {total} bytes, over the cap of {cap}", 413)
    return total


def move_into_place(staged: Path, target: Path, keep: Callable[[Path], None]) -> None:
    """Replace ``target`` by ``staged`` (renames on one filesystem); ``keep`` copies what the old folder had
    that the new one must keep (its model.json)."""
    keep(staged)
    old = target.with_name(f".{target.name}.old")
    if target.exists():
        os.replace(target, old)
    os.replace(staged, target)
    shutil.rmtree(old, ignore_errors=True)

"""netguard: the one guard every caller goes through (media, catalog downloads, batch-job input files), each
with its own limits. The media-specific behaviour is in test_media_sources.py / test_media_urls.py."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from mindie_service.catalog.download import check_source, download_limits, source_path_limits
from mindie_service.config import load_config
from mindie_service.errors import MediaError
from mindie_service.jobs.input_file import JobInputLimits, read_job_input
from mindie_service.jobs.spec import PathSpec
from mindie_service.netguard import (FetchPolicy, PathLimits, UrlLimits, check_url, lexical_path, read_regular,
                                     url_host_port)
from mindie_service.server.context import ServerContext
from multimodal import MediaPolicy
from tests.server_utils import write_mock_config


async def _blocking(fn, *args):  # type: ignore[no-untyped-def]
    return fn(*args)


def _refused(coro) -> MediaError:  # type: ignore[no-untyped-def]
    with pytest.raises(MediaError) as info:
        asyncio.run(coro)
    return info.value


def test_each_caller_labels_its_refusals_and_keeps_its_cap() -> None:
    policy = FetchPolicy(allowed_hosts=("models.example.com",))
    media = MediaPolicy(policy)
    assert download_limits(policy, 1 << 30).max_bytes == 1 << 30
    assert download_limits(policy, 1 << 30).read_timeout == policy.read_timeout * 20
    assert media.url_limits("image").max_bytes == media.max_image_bytes
    err = _refused(check_source("http://evil.example.net/m.tar", policy))
    assert err.status == 403 and err.message.startswith("source_url: ")
    err = _refused(check_url("http://127.0.0.1/x", UrlLimits(max_bytes=10), "prompt_file_path.value"))
    assert err.status == 403 and err.message.startswith("prompt_file_path.value: ") and "loopback" in err.message


def test_media_catalog_and_jobs_take_their_fetch_rules_from_one_fetch_policy() -> None:
    """Each caller keeps its own cap (and the large ones a longer read timeout); the rules are the policy's."""
    policy = FetchPolicy(allowed_local_paths=("/srv/in",), allow_private_urls=True, allowed_hosts=("A.example.com",),
                         max_url_len=300, connect_timeout=2.0, read_timeout=3.0)
    media, jobs = MediaPolicy(policy), JobInputLimits.build(policy, "/srv/jobs", max_bytes=100)
    for limits, read in ((media.url_limits("video"), 3.0), (download_limits(policy, 7), 60.0), (jobs.url, 60.0)):
        assert (limits.allowed_hosts, limits.allow_private, limits.max_url_len, limits.connect_timeout,
                limits.read_timeout) == (("a.example.com",), True, 300, 2.0, read)
    assert [lim.max_bytes for lim in (media.url_limits("video"), download_limits(policy, 7), jobs.url)] == [
        media.max_video_bytes, 7, 100]
    assert media.path_limits("audio").roots == source_path_limits(policy).roots == jobs.uri_files.roots == ("/srv/in",)
    assert jobs.files.roots == ("/srv/in", "/srv/jobs")


def test_the_server_builds_its_fetch_policy_from_the_media_keys(tmp_path: Path) -> None:
    """ServerConfig's allowedLocalMediaPaths, allowPrivateMediaUrls and mediaUrlAllowedHosts make the one
    FetchPolicy that media, catalog downloads and batch-job input files share."""
    (tmp_path / "in").mkdir()
    ctx = ServerContext(load_config(write_mock_config(
        tmp_path, allowedLocalMediaPaths=["in"], allowPrivateMediaUrls=True, mediaUrlAllowedHosts=["Cdn.Example.org"],
        maxMediaItems=3)))
    try:
        assert ctx.fetch_policy == FetchPolicy(allowed_local_paths=(str(tmp_path / "in"),), allow_private_urls=True,
                                               allowed_hosts=("cdn.example.org",))
        assert ctx.media_policy.fetch is ctx.fetch_policy and ctx.media_policy.max_items == 3
    finally:
        ctx.frontend.shutdown()


@pytest.mark.parametrize("url, words", [
    ("ftp://example.com/x", "only http(s)"),
    ("http://u:p@example.com/x", "credentials"),
    ("http://example.com:99999/x", "invalid port"),
    ("http://exa mple.com/x", "whitespace"),
])
def test_url_shape_is_refused_without_io(url: str, words: str) -> None:
    with pytest.raises(MediaError) as info:
        url_host_port(url, UrlLimits(max_bytes=10), "x")
    assert info.value.status == 422 and words in info.value.message


def test_paths_symlinks_out_fifos_and_caps(tmp_path: Path) -> None:
    root = tmp_path / "in"
    root.mkdir()
    (root / "ok.jsonl").write_bytes(b"{}\n")
    (tmp_path / "secret").write_bytes(b"s")
    os.symlink(tmp_path / "secret", root / "out")
    os.mkfifo(root / "fifo")
    limits = PathLimits((str(root),), max_bytes=4, cap_name="input file")
    assert read_regular(str(root / "ok.jsonl"), limits, "f") == b"{}\n"
    with pytest.raises(MediaError) as info:
        read_regular(str(root / "out"), limits, "f")
    assert info.value.status == 403 and "outside the allowed folders" in info.value.message
    with pytest.raises(MediaError) as info:
        read_regular(str(root / "fifo"), limits, "f")  # refused at stat: never opened, so never blocks
    assert info.value.status == 422 and "not a regular file" in info.value.message
    (root / "big").write_bytes(b"12345")
    with pytest.raises(MediaError) as info:
        read_regular(str(root / "big"), limits, "f")
    assert info.value.status == 413 and "input file cap" in info.value.message
    with pytest.raises(MediaError) as info:
        lexical_path(f"{root}/../secret", False, limits, "f")
    assert info.value.status == 403


def test_job_input_files_go_through_the_guard(tmp_path: Path) -> None:
    media, jobs = tmp_path / "media", tmp_path / "jobs"
    media.mkdir()
    jobs.mkdir()
    (jobs / "a.jsonl").write_bytes(b"{}\n")
    os.symlink("/dev/zero", jobs / "zero.jsonl")
    limits = JobInputLimits.build(FetchPolicy(allowed_local_paths=(str(media),)), str(jobs), max_bytes=100)
    assert asyncio.run(read_job_input(PathSpec(str(jobs / "a.jsonl"), "filepath"), limits, _blocking)) == b"{}\n"
    err = _refused(read_job_input(PathSpec(str(jobs / "zero.jsonl"), "filepath"), limits, _blocking))
    assert err.status == 403  # a link out of the folders (to a device)
    err = _refused(read_job_input(PathSpec("file://" + str(jobs / "a.jsonl"), "uri"), limits, _blocking))
    assert err.status == 403  # a uri may name the media folders only, not the jobs folder
    err = _refused(read_job_input(PathSpec("http://10.1.2.3/in.jsonl", "uri"), limits, _blocking))
    assert err.status == 403 and "private" in err.message

"""A batch job's ``filepath`` input: a relative path is refused saying it must be absolute and which folders
(by config key) may hold the file; an absolute path inside the jobs folder is read."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mindie_service.errors import MindieError
from mindie_service.jobs.input_file import JobInputLimits, read_job_input
from mindie_service.jobs.spec import PathSpec
from mindie_service.netguard import FetchPolicy


async def _inline(fn: Any, *args: Any) -> Any:
    return fn(*args)


def _read(value: str, jobs_dir: str) -> bytes:
    limits = JobInputLimits.build(FetchPolicy(), jobs_dir)
    return asyncio.run(read_job_input(PathSpec(value, "filepath"), limits, _inline))


def test_a_relative_filepath_says_it_must_be_absolute(tmp_path, monkeypatch):
    (tmp_path / "in.jsonl").write_text('{"prompt": "hi"}\n')
    monkeypatch.chdir(tmp_path)  # even where it would name a file, a relative path is not resolved
    with pytest.raises(MindieError) as e:
        _read("in.jsonl", str(tmp_path))
    msg = e.value.message
    assert e.value.status == 422 and msg.startswith("prompt_file_path.value: a filepath must be absolute")
    assert "ServerConfig.allowedLocalMediaPaths or batchJobsDir" in msg and "'in.jsonl'" in msg
    assert str(tmp_path) not in msg  # the server's folders are named by key, not told to the client


def test_an_absolute_filepath_inside_the_jobs_folder_is_read(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"prompt": "hi"}\n')
    assert _read(str(tmp_path / "in.jsonl"), str(tmp_path)) == b'{"prompt": "hi"}\n'

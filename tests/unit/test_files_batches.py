"""OpenAI Files and Batches below HTTP: the files store (atomic, swept after a kill, per owner, quota counts),
the streaming multipart upload (chunked anyhow, capped), batch line validation (OpenAI's codes, duplicate
custom_ids fail the batch) and the batch store's status stamps and record counts."""
from __future__ import annotations

import json

import pytest

from mindie_service.errors import BadRequestError
from mindie_service.jobs.batch_lines import validate_lines
from mindie_service.jobs.batch_store import BatchStore, batch_json
from mindie_service.server.files_upload import Upload, boundary_of
from mindie_service.storage.files_store import FilesStore


def _form(boundary: str, file_bytes: bytes, purpose: str = "batch", filename: str = "in.jsonl") -> bytes:
    b = boundary.encode()
    return (b"--" + b + b'\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n' + purpose.encode() + b"\r\n"
            b"--" + b + b'\r\nContent-Disposition: form-data; name="file"; filename="' + filename.encode() +
            b'"\r\nContent-Type: application/octet-stream\r\n\r\n' + file_bytes + b"\r\n--" + b + b"--\r\n")


@pytest.mark.parametrize("step", [1, 7, 1 << 16])
def test_upload_streams_the_file_part_to_disk_in_any_chunking(tmp_path, step):
    data = b"".join(json.dumps({"i": i}).encode() + b"\n" for i in range(300)) + b"--not-a-boundary\r\n"
    body = _form("XyZ", data)
    up = Upload(boundary_of("multipart/form-data; boundary=XyZ"), tmp_path / "u.part", 1 << 20)
    for k in range(0, len(body), step):
        up.feed(body[k:k + step])
    up.finish()
    assert up.fields == {"purpose": "batch"} and up.filename == "in.jsonl"
    assert (tmp_path / "u.part").read_bytes() == data and up.file_bytes == len(data)


def test_upload_past_the_cap_is_dropped_and_a_cut_body_refused(tmp_path):
    up = Upload(b"B", tmp_path / "big.part", 100)
    up.feed(_form("B", b"x" * 101))
    assert up.too_large and not (tmp_path / "big.part").exists()
    cut = Upload(b"B", tmp_path / "cut.part", 1000)
    cut.feed(_form("B", b"abc")[:-10])
    with pytest.raises(BadRequestError, match="ended before"):
        cut.finish()
    assert not (tmp_path / "cut.part").exists()
    with pytest.raises(BadRequestError, match="multipart/form-data"):
        boundary_of("application/json")


def test_files_store_is_atomic_per_owner_and_swept_after_a_kill(tmp_path):
    store = FilesStore(tmp_path, 1000, 10)
    tmp = store.new_tmp()
    tmp.write_bytes(b"hello")
    row = store.add(tmp, "alice", "batch", "a.jsonl")
    assert store.get(row.id, "alice") == row and store.get(row.id, "bob") is None
    assert store.used("alice") == 5 and store.used("bob") == 0
    assert b"".join(store.read(row.id)) == b"hello"
    # What a kill leaves: a partial upload, and bytes renamed whose row never came.
    store.new_tmp().write_bytes(b"partial")
    (store.data / "file-orphan").write_bytes(b"x")
    store.close()
    store = FilesStore(tmp_path, 1000, 10)
    assert list(store.tmp.iterdir()) == [] and sorted(p.name for p in store.data.iterdir()) == [row.id]
    rows = []
    for k in range(3):
        t = store.new_tmp()
        t.write_bytes(b"k")
        rows.append(store.add(t, "alice", "batch", f"{k}.jsonl"))
    page, more = store.list("alice", None, None, 2, "desc")
    assert [r.id for r in page] == [rows[2].id, rows[1].id] and more
    page, more = store.list("alice", None, rows[1].id, 5, "desc")
    assert [r.id for r in page] == [rows[0].id, row.id] and not more
    out = store.copy_in(store.path(row.id), 3, "alice", "batch_output", "o.jsonl", "file-fixed")
    assert store.copy_in(store.path(row.id), 5, "alice", "batch_output", "o.jsonl", "file-fixed") == out
    assert b"".join(store.read("file-fixed")) == b"hel" and store.used("alice") == 8  # outputs do not count
    assert not store.delete(row.id, "bob") and store.delete(row.id, "alice")
    assert not store.path(row.id).exists()


def _line(cid, url="/v1/chat/completions", **kw):
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": {"model": "m"}, **kw}).encode()


def test_batch_lines_are_validated_one_by_one_and_duplicates_fail_the_batch():
    raw = [_line("a"), b"{oops", _line("b", url="/v1/completions"), _line("c", method="GET"), _line(""),
           json.dumps({"custom_id": "d", "method": "POST", "url": "/v1/chat/completions", "body": 3}).encode(),
           _line("e", extra=1), b"[1]", _line("f")]
    good, bad, fatal = validate_lines(raw, "/v1/chat/completions")
    assert [(g.line, g.custom_id) for g in good] == [(0, "a"), (8, "f")] and fatal == []
    assert [(e.line, e.custom_id, e.code) for e in bad] == [
        (1, None, "invalid_json_line"), (2, "b", "invalid_url"), (3, "c", "invalid_method"),
        (4, None, "missing_custom_id"), (5, "d", "invalid_body"), (6, "e", "invalid_request"),
        (7, None, "invalid_json_line")]
    _, _, fatal = validate_lines([_line("a"), _line("b"), _line("a")], "/v1/chat/completions")
    assert [(f["code"], f["line"]) for f in fatal] == [("duplicate_custom_id", 3)]


def test_batch_store_stamps_each_status_once_and_counts_records(tmp_path):
    store = BatchStore(tmp_path)
    b = store.create_batch("o", "/v1/chat/completions", "file-1", "24h", 86400, {"k": "v"}, b"x\ny\n", 2)
    assert b.status == "validating" and b.expires_at == b.created_at + 86400
    assert store.batch(b.id, "other") is None and store.input_file(b.job_id).read_bytes() == b"x\ny\n"
    assert store.set_batch(b.id, "in_progress", only_from=("validating",))
    first = store.batch(b.id).stamps["in_progress"]  # type: ignore[union-attr]
    assert not store.set_batch(b.id, "in_progress", only_from=("validating",))
    assert store.commit(b.job_id, "success", 0, 0, {"custom_id": "x"})
    assert not store.commit(b.job_id, "success", 0, 0, {"custom_id": "x"})  # a record is written once
    assert store.commit(b.job_id, "error", 1, 0, {"custom_id": "y"})
    store.set_batch(b.id, "cancelling")
    assert not store.set_batch(b.id, "finalizing", only_from=("in_progress",))  # a cancel won the race
    assert [x.id for x in store.unfinished()] == [b.id]
    store.set_batch(b.id, "cancelled", output_file_id="file-o")
    got = batch_json(store.batch(b.id), store.counts(b.job_id))  # type: ignore[arg-type]
    assert got["status"] == "cancelled" and got["in_progress_at"] == first and got["cancelled_at"]
    assert got["request_counts"] == {"total": 2, "completed": 1, "failed": 1} and got["output_file_id"] == "file-o"
    assert got["metadata"] == {"k": "v"} and got["completed_at"] is None and store.unfinished() == []

"""OpenAI Files + Batches over HTTP with the pinned `openai` client: each line's body equals the online route's
answer, bad lines go to the error file, keys own their files and batches, refusals in OpenAI's shape, expiry,
cancel, and a real kill -9 mid-batch resumed with no custom_id written twice."""
from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import openai
import pytest
import requests

from tests.prompts import word_prompts
from tests.server_utils import ServerProcess, wait_until, write_config

# ids and timestamps differ between two answers, and so does the prefix cache's share of the prompt (the batch
# line ran first: the online call finds its prompt cached)
VOLATILE = ("id", "created", "created_at", "completed_at", "cached_tokens")


def _server(tmp: Path, tiny_model: Path, **server: Any) -> ServerProcess:
    server = {"batchJobsDir": str(tmp / "jobs"), "filesStore": {"dir": str(tmp / "files")},
              "batchCompletionWindows": ["24h", "1s"], **server}
    cfg = write_config(tmp / "config.json", tiny_model, server=server)
    return ServerProcess(cfg, tmp / f"server-{len(list(tmp.glob('server*.log')))}.log")


def _client(srv: ServerProcess, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url() + "/v1", api_key=key, max_retries=0, timeout=60)


def _chat_body(i: int, max_tokens: int = 5) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": word_prompts(1, 3, 10, seed=i)[0]}],
            "max_tokens": max_tokens, "temperature": 0}


def _line(cid: str, body: dict[str, Any], url: str = "/v1/chat/completions") -> bytes:
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body}).encode()


def _jsonl(lines: list[bytes]) -> bytes:
    return b"\n".join(lines) + b"\n"


def _strip(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _wait_done(client: openai.OpenAI, bid: str, timeout: float = 240) -> Any:
    box: list[Any] = []
    assert wait_until(lambda: box.append(client.batches.retrieve(bid)) or box[-1].status in (
        "completed", "failed", "expired", "cancelled"), timeout=timeout, interval=0.3), box[-1]
    return box[-1]


def _records(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def test_openai_client_batch_answers_equal_the_online_routes(tmp_path, tiny_model):
    srv = _server(tmp_path, tiny_model).start().wait_ready()
    try:
        client = _client(srv)
        lines = [_line(f"req-{i}", _chat_body(i)) for i in range(16)]
        lines[0] = _line("req-0", {**_chat_body(0), "store": True, "metadata": {"from": "batch"}})
        lines[3] = b"not json"
        lines[7] = _line("wrong-url", _chat_body(7), url="/v1/completions")
        lines[11] = _line("bad-temp", {**_chat_body(11), "temperature": 3})  # the route's own 400
        f = client.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch")
        assert f.purpose == "batch" and f.bytes == len(_jsonl(lines))
        assert client.files.retrieve(f.id).filename == "in.jsonl"
        assert client.files.content(f.id).content == _jsonl(lines)
        batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                                      metadata={"run": "t1"})
        assert batch.status == "validating" and batch.metadata == {"run": "t1"}
        done = _wait_done(client, batch.id)
        assert done.status == "completed", done
        assert done.request_counts.total == 16 and done.request_counts.completed == 13
        assert done.request_counts.failed == 3
        assert done.in_progress_at and done.finalizing_at and done.completed_at and done.expires_at
        out, err = _records(client, done.output_file_id), _records(client, done.error_file_id)
        assert sorted(r["custom_id"] for r in out) == sorted(f"req-{i}" for i in range(16) if i not in (3, 7, 11))
        assert {(r["custom_id"], (r["error"] or {}).get("code")) for r in err} == {
            (None, "invalid_json_line"), ("wrong-url", "invalid_url"), ("bad-temp", None)}
        bad_temp = next(r for r in err if r["custom_id"] == "bad-temp")["response"]
        online = requests.post(srv.url() + "/v1/chat/completions", json={**_chat_body(11), "temperature": 3})
        assert bad_temp["status_code"] == online.status_code == 400 and bad_temp["body"] == online.json()
        # Greedy: each body is what /v1/chat/completions answers for the same request, ids and times aside.
        for rec in out:
            assert rec["response"]["status_code"] == 200 and rec["error"] is None and rec["id"].startswith("batch_req_")
            i = int(rec["custom_id"].split("-")[1])
            online = client.chat.completions.create(**_chat_body(i)).model_dump(exclude_unset=True)
            assert _strip(rec["response"]["body"]) == _strip(online)
        stored = next(r for r in out if r["custom_id"] == "req-0")["response"]["body"]  # chat's store: true
        assert client.chat.completions.retrieve(stored["id"]).metadata == {"from": "batch"}
        assert client.files.retrieve(done.output_file_id).purpose == "batch_output"
        _other_endpoints(client)
        assert client.files.delete(f.id).deleted
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(f.id)
    finally:
        assert srv.stop() == 0


def _other_endpoints(client: openai.OpenAI) -> None:
    """/v1/completions, /v1/responses and /v1/embeddings lines answer as their routes do."""
    comp = {"model": "tiny", "prompt": word_prompts(1, 3, 8, seed=40)[0], "max_tokens": 4, "temperature": 0}
    resp = {"model": "tiny", "input": word_prompts(1, 3, 8, seed=41)[0], "max_output_tokens": 4, "temperature": 0,
            "store": False}
    emb = {"model": "tiny", "input": word_prompts(2, 3, 8, seed=42), "encoding_format": "float"}
    for url, body, online in (("/v1/completions", comp, lambda: client.completions.create(**comp)),
                              ("/v1/responses", resp, lambda: client.responses.create(**resp)),
                              ("/v1/embeddings", emb, lambda: client.embeddings.create(**emb))):
        f = client.files.create(file=("x.jsonl", _jsonl([_line("only", body, url)])), purpose="batch")
        done = _wait_done(client, client.batches.create(input_file_id=f.id, endpoint=url,
                                                        completion_window="24h").id)
        [rec] = _records(client, done.output_file_id)
        assert _strip(rec["response"]["body"]) == _strip(online().model_dump(exclude_unset=True)), url


def test_refusals_ownership_expiry_and_cancel(tmp_path, tiny_model):
    srv = _server(tmp_path, tiny_model, businessApiKeys=["key-aaaaaaaa", "key-bbbbbbbb"], batchMaxRunning=1,
                  filesStore={"dir": str(tmp_path / "files"), "maxFileBytes": 200_000}).start().wait_ready()
    try:
        a, b = _client(srv, "key-aaaaaaaa"), _client(srv, "key-bbbbbbbb")
        long = _jsonl([_line(f"l{i}", _chat_body(i, max_tokens=64)) for i in range(200)])
        fa = a.files.create(file=("a.jsonl", long), purpose="batch")
        # Another key's file is as absent as a missing one, for reading, listing and batching.
        with pytest.raises(openai.NotFoundError):
            b.files.retrieve(fa.id)
        with pytest.raises(openai.NotFoundError):
            b.files.content(fa.id)
        assert [x.id for x in b.files.list().data] == [] and [x.id for x in a.files.list().data] == [fa.id]
        with pytest.raises(openai.NotFoundError):
            b.batches.create(input_file_id=fa.id, endpoint="/v1/chat/completions", completion_window="24h")
        with pytest.raises(openai.BadRequestError, match="endpoint"):
            a.batches.create(input_file_id=fa.id, endpoint="/v1/nope", completion_window="24h")  # type: ignore[arg-type]
        with pytest.raises(openai.BadRequestError, match="batchCompletionWindows"):
            a.batches.create(input_file_id=fa.id, endpoint="/v1/chat/completions", completion_window="2h")  # type: ignore[arg-type]
        with pytest.raises(openai.BadRequestError, match="purpose"):
            a.files.create(file=("p.jsonl", b"{}\n"), purpose="fine-tune")
        with pytest.raises(openai.APIStatusError) as big:
            a.files.create(file=("big.jsonl", b"x" * 200_001), purpose="batch")
        assert big.value.status_code == 413 and "maxFileBytes" in big.value.body["message"]
        assert list((tmp_path / "files" / "tmp").iterdir()) == []  # the partial upload is gone
        dup = a.files.create(file=("d.jsonl", _jsonl([_line("same", _chat_body(1)), _line("same", _chat_body(2))])),
                             purpose="batch")
        failed = _wait_done(a, a.batches.create(input_file_id=dup.id, endpoint="/v1/chat/completions",
                                                completion_window="24h").id)
        assert failed.status == "failed" and failed.errors.data[0].code == "duplicate_custom_id"
        assert failed.errors.data[0].line == 2
        # The window passes: what was answered stays, the rest is answered batch_expired.
        exp = _wait_done(a, a.batches.create(input_file_id=fa.id, endpoint="/v1/chat/completions",
                                             completion_window="1s").id)  # type: ignore[arg-type]
        assert exp.status == "expired" and exp.expired_at
        out, err = _records(a, exp.output_file_id), _records(a, exp.error_file_id)
        assert len(out) + len(err) == 200 and len(err) > 0
        assert {r["error"]["code"] for r in err} == {"batch_expired"}
        assert Counter(r["custom_id"] for r in out + err) == Counter(f"l{i}" for i in range(200))
        _cancel(srv, a, b, fa.id)
        page = a.batches.list(limit=2)
        assert len(page.data) == 2 and page.has_more
        rest = a.batches.list(limit=10, after=page.data[-1].id)
        assert len(rest.data) == 1 and not rest.has_more and [x.id for x in b.batches.list().data] == []
    finally:
        srv.stop()


def _cancel(srv: ServerProcess, a: openai.OpenAI, b: openai.OpenAI, file_id: str) -> None:
    batch = a.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        b.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        b.batches.cancel(batch.id)
    # Its lines run at batch priority (counted apart), never more than batchMaxRunning (1) at once.
    seen: list[dict[str, int]] = []
    assert wait_until(lambda: seen.append(srv.status()["batch"]) or seen[-1]["running"] > 0, timeout=60)
    assert all(s["running"] + s["waiting"] <= 1 for s in seen)
    assert wait_until(lambda: a.batches.retrieve(batch.id).request_counts.completed >= 1, timeout=120)
    assert a.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    done = _wait_done(a, batch.id, timeout=60)
    assert done.status == "cancelled" and done.cancelling_at and done.cancelled_at
    out = _records(a, done.output_file_id)
    assert 1 <= len(out) == done.request_counts.completed < 200
    with pytest.raises(openai.APIStatusError):
        a.batches.cancel(batch.id)


@pytest.mark.timeout(600)
def test_kill_9_mid_batch_resumes_without_repeating_a_custom_id(tmp_path, tiny_model):
    srv = _server(tmp_path, tiny_model, batchMaxRunning=4).start().wait_ready()
    client = _client(srv)
    n = 24
    f = client.files.create(file=("k.jsonl", _jsonl([_line(f"k{i}", _chat_body(i, 10)) for i in range(n)])),
                            purpose="batch")
    bid = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id
    assert wait_until(lambda: client.batches.retrieve(bid).request_counts.completed >= 4, timeout=180)
    srv.proc.kill()  # SIGKILL: no drain, no clean-up
    srv.proc.wait(10)
    srv = _server(tmp_path, tiny_model, batchMaxRunning=4).start().wait_ready()
    try:
        client = _client(srv)
        assert client.files.retrieve(f.id).bytes == f.bytes  # the upload survived
        done = _wait_done(client, bid, timeout=400)
        assert done.status == "completed" and done.request_counts.completed == n
        out = _records(client, done.output_file_id)
        assert Counter(r["custom_id"] for r in out) == Counter(f"k{i}" for i in range(n))
        assert done.error_file_id is None
    finally:
        assert srv.stop() == 0

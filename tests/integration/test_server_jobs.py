"""Batch inference jobs over HTTP (llama-stack's seed): records, validation, cancel, and a real kill -9."""
from __future__ import annotations

import base64
import contextlib
import http.server
import json
import threading
from collections.abc import Iterator
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from mindie_service import LLM, SamplingParams
from mindie_service.inputs import ChatMessage, ChatPrompt
from tests.prompts import word_prompts
from tests.server_utils import ServerProcess, wait_until, write_config

BAD = {3: b"not json", 50: b'[{"role": "wizard", "text": "hi"}]',
       99: b'[{"role": "user", "text": "look", "attachments": [{"attachment_type": "image", "data_type": "uri", '
           b'"data": "http://example.com/x.png"}]}]',
       120: b"[]", 199: b'{"role": "user"}'}


def _conversation(i: int) -> list[dict[str, str]]:
    words = word_prompts(1, 3, 12, seed=i)[0]
    msgs = [{"role": "user", "text": words}]
    if i % 3 == 0:
        msgs.insert(0, {"role": "system", "text": "Answer briefly."})
    return msgs


def _jsonl(n: int = 200) -> bytes:
    return b"\n".join(BAD.get(i, json.dumps(_conversation(i)).encode()) for i in range(n)) + b"\n"


def _server(tmp: Path, tiny_model: Path, **server: Any) -> ServerProcess:
    cfg = write_config(tmp / "config.json", tiny_model,
                       server={"batchJobsDir": str(tmp / "jobs"), "allowedLocalMediaPaths": [str(tmp / "in")],
                               "batchMaxLines": 300, **server})
    (tmp / "in").mkdir(exist_ok=True)
    return ServerProcess(cfg, tmp / f"server-{len(list(tmp.glob('server*.log')))}.log")


def _submit(srv: ServerProcess, data: bytes, **kw: Any) -> Any:
    body = {"model": "tiny", "prompt_file_path": {"value": base64.b64encode(data).decode(), "type": "raw_bytes"},
            "options": {"max_tokens": 6, "temperature": 0}, "num_generations": 2}
    body.update(kw)
    return srv.post("/batch_inference/submit_job", body)


@contextlib.contextmanager
def _serve_file(data: bytes) -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/input.jsonl"
    finally:
        httpd.shutdown()


def _status(srv: ServerProcess, job_id: str) -> dict[str, Any]:
    r = srv.get(f"/batch_inference/job_status?job_id={job_id}")
    assert r.status_code == 200, r.text
    return r.json()


def _records(srv: ServerProcess, job_id: str, kind: str) -> list[dict[str, Any]]:
    r = srv.get(f"/batch_inference/job_results?job_id={job_id}&kind={kind}")
    assert r.status_code == 200
    return [json.loads(x) for x in r.text.splitlines()]


def _check_complete(srv: ServerProcess, job_id: str) -> list[dict[str, Any]]:
    ok, bad = _records(srv, job_id, "success"), _records(srv, job_id, "error")
    assert len(ok) == 390 and len(bad) == 5
    assert Counter((r["line"], r["generation"]) for r in ok) == Counter(
        {(i, g): 1 for i in range(200) if i not in BAD for g in range(2)})
    assert sorted(r["line"] for r in bad) == sorted(BAD) and all(r["error"] for r in bad)
    # The files on disk hold exactly what the results route serves.
    st = _status(srv, job_id)
    assert Path(st["success_file_path"]["value"]).read_text().count("\n") == 390
    assert st["metadata"]["lines_done"] == 200 and st["metadata"]["lines_failed"] == 5
    assert st["metadata"]["generations_written"] == 390
    return ok


def test_job_writes_one_record_per_line_and_generation_matching_the_offline_engine(tmp_path, tiny_model):
    srv = _server(tmp_path, tiny_model).start().wait_ready()
    try:
        r = _submit(srv, _jsonl())
        assert r.status_code == 200, r.text
        job = r.json()
        assert job["status"] == "validating" and job["created"].endswith("Z")
        assert job["success_file_path"]["type"] == "filepath"
        assert wait_until(lambda: _status(srv, job["job_id"])["status"] == "completed", timeout=240)
        ok = _check_complete(srv, job["job_id"])
        # The same conversations sent one by one to /v1/chat/completions give the same greedy text.
        texts = {r["line"]: r["text"] for r in ok if r["generation"] == 0}
        for line in (0, 1, 7, 198):
            msgs = [{"role": m["role"], "content": m["text"]} for m in _conversation(line)]
            r = srv.post("/v1/chat/completions", {"model": "tiny", "messages": msgs, "max_tokens": 6,
                                                   "temperature": 0})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == texts[line]
    finally:
        assert srv.stop() == 0
    # Greedy: both generations of a line agree, and equal the same conversation run alone offline.
    by_line: dict[int, set[str]] = {}
    for rec in ok:
        by_line.setdefault(rec["line"], set()).add(rec["text"])
        assert rec["finish_reason"] in ("stop", "length") and rec["usage"]["completion_tokens"] <= 6
    assert all(len(v) == 1 for v in by_line.values())
    llm = LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=256)
    for line in (0, 1, 7, 198):
        prompt = ChatPrompt(tuple(ChatMessage(m["role"], m["text"]) for m in _conversation(line)))
        req = llm.input_processor.process(prompt, SamplingParams(max_tokens=6, temperature=0.0), request_id="x")
        out = llm.generate([list(req.prompt_token_ids)], SamplingParams(max_tokens=6, temperature=0.0),
                           use_tqdm=False)[0]
        assert by_line[line] == {out.outputs[0].text}


def test_submit_is_validated(tmp_path, tiny_model):
    srv = _server(tmp_path, tiny_model, batchMaxLines=10).start().wait_ready()
    try:
        assert _submit(srv, _jsonl(5), model="nope").status_code == 404
        r = _submit(srv, _jsonl(5), num_generations=17)
        assert r.status_code == 422 and "num_generations" in r.json()["error"]
        r = _submit(srv, _jsonl(5), options={"temperature": 3})
        assert r.status_code == 422 and "options.temperature" in r.json()["error"]
        r = _submit(srv, _jsonl(11))
        assert r.status_code == 413 and "batchMaxLines" in r.json()["error"]
        outside = tmp_path / "elsewhere.jsonl"
        outside.write_bytes(_jsonl(2))
        r = srv.post("/batch_inference/submit_job", {"model": "tiny", "prompt_file_path":
                                                     {"value": str(outside), "type": "filepath"}})
        assert r.status_code == 403
        inside = tmp_path / "in" / "ok.jsonl"
        inside.write_bytes(_jsonl(2))
        r = srv.post("/batch_inference/submit_job", {"model": "tiny", "prompt_file_path":
                                                     {"value": str(inside), "type": "filepath"}})
        assert r.status_code == 200
        private = srv.post("/batch_inference/submit_job", {"model": "tiny", "prompt_file_path":
                                                           {"value": "http://127.0.0.1:9/in.jsonl", "type": "uri"}})
        assert private.status_code == 403 and "prompt_file_path" in private.json()["error"]  # refused address
        data_uri = "data:application/jsonl;base64," + base64.b64encode(_jsonl(2)).decode()
        r2 = srv.post("/batch_inference/submit_job", {"model": "tiny", "prompt_file_path":
                                                      {"value": data_uri, "type": "uri"}})
        assert r2.status_code == 200
        assert srv.get("/batch_inference/job_status?job_id=job-missing").status_code == 404
        listed = srv.get("/batch_inference/jobs").json()
        assert listed["total"] == 2 and [j["job_id"] for j in listed["data"]] == [r2.json()["job_id"],
                                                                                  r.json()["job_id"]]
    finally:
        srv.stop()


def test_cancel_stops_a_job_and_keeps_what_was_written(tmp_path, tiny_model):
    srv = _server(tmp_path, tiny_model, batchMaxRunning=2, allowPrivateMediaUrls=True).start().wait_ready()
    try:
        # An input file fetched over http(s) (loopback allowed by this server's config).
        with _serve_file(_jsonl(3)) as url:
            r = srv.post("/batch_inference/submit_job", {"model": "tiny", "prompt_file_path": {"value": url, "type": "uri"},
                                                         "options": {"max_tokens": 2}})
        assert r.status_code == 200, r.text
        assert wait_until(lambda: _status(srv, r.json()["job_id"])["status"] == "completed", timeout=60)
        assert len(_records(srv, r.json()["job_id"], "success")) == 3
        job = _submit(srv, _jsonl(), options={"max_tokens": 64, "temperature": 0}).json()["job_id"]
        assert wait_until(lambda: _status(srv, job)["metadata"]["generations_written"] >= 4, timeout=120)
        # Batch lines are counted apart, and never more than batchMaxRunning are in the engine.
        seen: list[dict[str, int]] = []
        assert wait_until(lambda: seen.append(srv.status()["batch"]) or seen[-1]["running"] > 0, timeout=60)
        assert all(b["jobs_active"] == 1 and b["running"] + b["waiting"] <= 2 for b in seen)
        metrics = srv.get("/metrics", "metrics").text
        assert 'num_batch_requests_running{model_name="tiny"}' in metrics
        r = srv.post(f"/batch_inference/cancel_job?job_id={job}", {})
        assert r.status_code == 200 and r.json()["status"] == "failed" and r.json()["metadata"]["cancelled"]
        written = _status(srv, job)["metadata"]["generations_written"]
        assert written < 390 and len(_records(srv, job, "success")) == written
        # The cancelled lines leave the engine (aborts apply at the engine's next step: within seconds, while an
        # uncancelled job would keep feeding it lines for minutes).
        assert wait_until(lambda: (lambda st: st["running"] == 0 and st["waiting"] == 0)(srv.status()["requests"]),
                          timeout=10)
        assert srv.post(f"/batch_inference/cancel_job?job_id={job}", {}).status_code == 409
    finally:
        srv.stop()


@pytest.mark.timeout(600)
def test_kill_9_mid_job_resumes_without_losing_or_repeating_a_record(tmp_path, tiny_model):
    srv = _server(tmp_path, tiny_model, batchMaxRunning=4).start().wait_ready()
    job = _submit(srv, _jsonl(), options={"max_tokens": 24, "temperature": 0}).json()["job_id"]
    assert wait_until(lambda: _status(srv, job)["metadata"]["generations_written"] >= 30, timeout=180)
    srv.proc.kill()  # SIGKILL: no drain, no clean-up
    srv.proc.wait(10)
    before = (tmp_path / "jobs" / job / "success.jsonl").read_text().count("\n")
    assert 30 <= before < 390
    srv = _server(tmp_path, tiny_model, batchMaxRunning=4).start().wait_ready()
    try:
        assert wait_until(lambda: _status(srv, job)["status"] == "completed", timeout=400)
        _check_complete(srv, job)
    finally:
        assert srv.stop() == 0

"""The seed REST API over HTTP (shared/seeds/rest-api-integrations.md): /api/generate-one streamed as raw
chunked text, /api/generate-batch, continuation by request_id, errors in MindIE's shape."""
from __future__ import annotations

import json
import socket
import threading

import pytest
import requests

from tests.server_utils import ServerProcess, plain_server, shared_server, write_config

PROMPT = "The river runs past the old mill and"


@pytest.fixture(scope="session")
def srv(request, tiny_model):
    return plain_server(request, tiny_model)


@pytest.fixture(scope="session")
def rest_srv(request, tiny_model):
    """Long generations (their clients leave early), maxLinkNum 3, generation defaults from the config section
    and a .env file beside it."""
    def make(tmp):
        cfg = write_config(tmp / "config.json", tiny_model, server={"maxLinkNum": 3},
                           deploy={"maxSeqLen": 4096, "maxInputTokenLen": 256},
                           schedule={"maxIterTimes": 4000, "numKvBlocks": 600, "maxPrefillTokens": 4096})
        data = json.loads(cfg.read_text())
        data["GenerationDefaults"] = {"max_new_tokens": 5, "top_k": 7}
        cfg.write_text(json.dumps(data))
        (tmp / ".env").write_text("# defaults for /api/*\nMINDIE_GEN_MAX_NEW_TOKENS=3\n")
        return ServerProcess(cfg, tmp / "server.log")
    return shared_server("rest", request, make)


def one(srv, rid, prompt=PROMPT, **kw):
    body = {"request_id": rid, "prompt": prompt, "stream_response": False, **kw}
    return requests.post(srv.url() + "/api/generate-one", data=json.dumps(body), timeout=60)


def greedy(n):
    return {"do_sample": False, "max_new_tokens": n}


def raw_chunks(srv, body: dict, on_first=None, max_chunks: int | None = None):
    """POST with a plain socket and read the chunked body by hand: (status, headers, chunks, complete).
    ``complete`` says whether the terminating zero-length chunk arrived; with ``max_chunks`` the client leaves
    after that many (the server aborts the request)."""
    host, port = srv.url().split("//")[1].split(":")
    data = json.dumps(body).encode()
    s = socket.create_connection((host, int(port)), timeout=60)
    s.sendall(b"POST /api/generate-one HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
    f = s.makefile("rb")
    status = int(f.readline().split()[1])
    headers = {}
    while (line := f.readline()) not in (b"\r\n", b""):
        k, _, v = line.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    chunks: list[bytes] = []
    complete = False
    while True:
        size_line = f.readline()
        if not size_line:
            break  # connection closed without the last chunk
        size = int(size_line.strip() or b"0", 16)
        if size == 0:
            complete = f.readline() == b"\r\n"
            break
        chunk = f.read(size)
        f.readline()
        chunks.append(chunk)
        if len(chunks) == 1 and on_first is not None:
            on_first()
        if len(chunks) == max_chunks:
            break
    s.close()
    return status, headers, chunks, complete


def test_stream_arrives_in_chunks_of_whole_utf8_before_the_request_ends(rest_srv):
    seen_running = []

    def on_first():  # the first chunk is here while the engine is still generating
        seen_running.append(rest_srv.status()["requests"]["running"])

    body = {"request_id": "stream-utf8", "prompt": "猫が好きです 🐱 and the river",
            "generation_config": {"max_new_tokens": 3000, "do_sample": False}}  # far longer than the first chunks
    status, headers, chunks, complete = raw_chunks(rest_srv, body, on_first, max_chunks=8)
    assert status == 200 and headers["content-type"] == "text/plain; charset=utf-8"
    assert headers.get("transfer-encoding") == "chunked"
    assert len(chunks) >= 2
    for c in chunks:
        c.decode("utf-8")  # strict: a split character raises
    assert seen_running and seen_running[0] != 0


def test_stream_equals_non_stream_and_full_text_prepends_the_prompt(srv):
    cfg = greedy(12)
    r = one(srv, "nonstream", generation_config=cfg)
    assert r.status_code == 200 and r.headers["Content-Type"] == "text/plain; charset=utf-8"
    _, _, chunks, complete = raw_chunks(srv, {"request_id": "stream", "prompt": PROMPT, "generation_config": cfg})
    assert complete and b"".join(chunks).decode() == r.text
    full = one(srv, "full", only_new_tokens=False, generation_config=cfg)
    assert full.text.endswith(r.text) and PROMPT in full.text and len(full.text) > len(r.text)


def test_batch_in_request_order_equals_one_at_a_time(srv):
    prompts = [{"request_id": f"b{i}", "prompt": p} for i, p in
               enumerate([PROMPT, "Once upon a time", "ocean castle mountain", "a"])]
    r = requests.post(srv.url() + "/api/generate-batch",
                      json={"prompts": prompts, "only_new_tokens": False, "generation_config": greedy(10)})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [o["request_id"] for o in out] == [p["request_id"] for p in prompts]
    for p, o in zip(prompts, out):
        assert set(o) == {"request_id", "prompt", "response"} and p["prompt"] in o["prompt"]
        alone = one(srv, "solo-" + p["request_id"], p["prompt"], generation_config=greedy(10))
        assert o["response"] == alone.text
    short = requests.post(srv.url() + "/api/generate-batch",
                          json={"prompts": [{"request_id": "s0", "prompt": "x"}], "generation_config": greedy(2)})
    assert set(short.json()[0]) == {"request_id", "response"}


def test_continuation_by_request_id(srv):
    a = one(srv, "sess", generation_config=greedy(9))
    b = one(srv, "sess", "ignored: the session continues", generation_config=greedy(11))
    whole = one(srv, "sess-whole", generation_config=greedy(20))
    assert a.text + b.text == whole.text
    c = one(srv, "sess", "", only_new_tokens=False, generation_config=greedy(4))
    assert c.text.startswith("<s>") and (a.text + b.text) in c.text  # the whole session text
    metrics = srv.get("/metrics", "metrics").text
    hits = [ln for ln in metrics.splitlines() if ln.startswith("session_hits_total")]
    assert hits and float(hits[0].split()[-1]) >= 2


def test_same_request_id_twice_at_once_is_409(rest_srv):
    result = {}

    def long_stream():
        result["r"] = raw_chunks(rest_srv, {"request_id": "busy", "prompt": PROMPT,
                                            "generation_config": {"max_new_tokens": 3000, "do_sample": False}},
                                 on_first=lambda: result.setdefault("second", one(rest_srv, "busy")), max_chunks=1)
    t = threading.Thread(target=long_stream)
    t.start()
    t.join(60)
    second = result["second"]
    assert second.status_code == 409 and second.json()["error_type"] == "conflict" and "busy" in second.json()["error"]


def test_defaults_precedence_request_over_env_over_section(rest_srv):
    def generated() -> float:
        text = rest_srv.get("/metrics", "metrics").text
        return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith("generation_tokens_total"))

    before = generated()
    assert one(rest_srv, "d1").status_code == 200  # .env's MINDIE_GEN_MAX_NEW_TOKENS=3 beats the section's 5
    mid = generated()
    assert one(rest_srv, "d2", generation_config={"max_new_tokens": 6}).status_code == 200
    assert (mid - before, generated() - mid) == (3, 6)


def test_batch_counts_against_max_link_num(rest_srv):
    prompts = [{"request_id": f"adm{i}", "prompt": "x"} for i in range(4)]
    r = requests.post(rest_srv.url() + "/api/generate-batch", json={"prompts": prompts})
    assert r.status_code == 429 and r.json()["error_type"] == "overloaded"


@pytest.mark.parametrize("body, status, needle", [
    ({"request_id": "e", "prompt": "x", "generation_config": {"num_beams": 2, "do_sample": True}}, 422,
     "generation_config.num_beams must be 1 when generation_config.do_sample is true"),
    ({"request_id": "e", "prompt": "x", "generation_config": {"top_p": 0}}, 422, "generation_config.top_p"),
    ({"prompt": "x"}, 422, "request_id"),
])
def test_errors_have_mindie_shape_and_name_the_field(srv, body, status, needle):
    r = requests.post(srv.url() + "/api/generate-one", json=body)
    assert r.status_code == status and set(r.json()) == {"error", "error_type"} and needle in r.json()["error"]
    bad = requests.post(srv.url() + "/api/generate-batch",
                        json={"prompts": [{"request_id": "a", "prompt": "x"}, {"request_id": "a", "prompt": "y"}]})
    assert bad.status_code == 422 and "prompts[1].request_id" in bad.json()["error"]


def test_beam_search_over_http_is_sent_once(srv):
    cfg = {"num_beams": 3, "do_sample": False, "max_new_tokens": 10, "length_penalty": 1.0}
    whole = one(srv, "beam-ns", generation_config=cfg)
    assert whole.status_code == 200, whole.text
    _, _, chunks, complete = raw_chunks(srv, {"request_id": "beam-s", "prompt": PROMPT, "generation_config": cfg})
    assert complete and len(chunks) == 1 and chunks[0].decode() == whole.text

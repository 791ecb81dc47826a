"""BackendConfig.modelInstanceNumber = 2 over HTTP: concurrent requests land on both instances (per-instance
/v1/status and /metrics say so), greedy output equals a single-instance server's, and a /api/* session
continues on the instance that holds it even when that instance is the busier one."""
from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.prompts import word_prompts
from tests.server_utils import ServerProcess, plain_server, shared_server, sse_frames, wait_until, write_config

PROMPT = "The river runs past the old mill and"


@pytest.fixture(scope="module")
def single(request, tiny_model):
    return plain_server(request, tiny_model)


@pytest.fixture(scope="module")
def srv(request, tiny_model):
    def make(tmp):
        cfg = write_config(tmp / "config.json", tiny_model, deploy={"maxSeqLen": 4096, "maxInputTokenLen": 256},
                           schedule={"maxIterTimes": 4000, "numKvBlocks": 600, "maxPrefillTokens": 4096})
        data = json.loads(cfg.read_text())
        data["BackendConfig"].update(modelInstanceNumber=2, npuDeviceIds=[[0], [0]])
        cfg.write_text(json.dumps(data))
        return ServerProcess(cfg, tmp / "server.log")
    return shared_server("instances", request, make)


def instances(srv) -> list[dict]:
    return srv.status()["instances"]


def generate(srv, prompt: str, n: int = 16) -> str:
    r = srv.post("/generate", {"inputs": prompt, "parameters": {"max_new_tokens": n, "do_sample": False}})
    assert r.status_code == 200, r.text
    return r.json()["generated_text"]


def one(srv, rid: str, prompt: str = PROMPT, n: int = 8) -> str:
    r = srv.post("/api/generate-one", {"request_id": rid, "prompt": prompt, "stream_response": False,
                                       "generation_config": {"do_sample": False, "max_new_tokens": n}})
    assert r.status_code == 200, r.text
    return r.text


class Busy:
    """A long greedy stream holding one instance until closed (closing it aborts the request)."""

    def __init__(self, srv) -> None:
        self.resp = requests.post(srv.url() + "/generate_stream", stream=True, timeout=60,
                                  json={"inputs": PROMPT, "parameters": {"max_new_tokens": 3000}})
        self.frames = sse_frames(self.resp)  # kept: dropping the iterator would close the stream
        next(self.frames)  # running: its first token came

    def close(self) -> None:
        self.resp.close()


def test_two_instances_are_reported(srv):
    st = srv.status()
    assert [i["instance"] for i in st["instances"]] == [0, 1]
    assert all(i["status"] == "ready" for i in st["instances"])
    # The top-level figures are the instances' sums.
    assert st["blocks"]["total"] == sum(i["blocks"]["total"] for i in st["instances"]) == 1200


def test_concurrent_requests_use_both_instances_and_match_one_instance(srv, single):
    prompts = word_prompts(8, 4, 24, seed=3)
    before = [i["requests"]["routed"] for i in instances(srv)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda p: generate(srv, p), prompts))
    after = [i["requests"]["routed"] for i in instances(srv)]
    routed = [a - b for a, b in zip(after, before)]
    assert sum(routed) == 8 and min(routed) >= 2, routed  # least outstanding work spreads them
    assert got == [generate(single, p) for p in prompts]
    metrics = srv.get("/metrics", "metrics").text
    for k in (0, 1):
        m = re.search(rf'^instance_requests_routed_total{{instance="{k}",model_name="tiny"}} (\S+)$', metrics, re.M)
        assert m and float(m.group(1)) == after[k], metrics


def test_a_session_continues_on_its_instance_even_when_it_is_busier(srv):
    before = [i["requests"]["routed"] for i in instances(srv)]
    a = one(srv, "inst-sess", n=9)
    routed = [i["requests"]["routed"] for i in instances(srv)]
    owner = next(k for k in (0, 1) if routed[k] > before[k])
    hits = instances(srv)[owner]["sessionHits"]
    # Make the owner the busier instance: load alone would send the continuation to the other one.
    busy = [Busy(srv)]
    try:
        if instances(srv)[owner]["requests"]["in_flight"] == 0:
            busy.append(Busy(srv))  # the owner takes this one (the other already has one)
            busy.pop(0).close()
            assert wait_until(lambda: instances(srv)[1 - owner]["requests"]["in_flight"] == 0)
        st = instances(srv)
        assert st[owner]["requests"]["in_flight"] == 1 and st[1 - owner]["requests"]["in_flight"] == 0
        sent = [i["requests"]["routed"] for i in st]
        b = one(srv, "inst-sess", "ignored: the session continues", n=11)
        st = instances(srv)
        assert [i["requests"]["routed"] - s for i, s in zip(st, sent)] == [int(k == owner) for k in (0, 1)]
        assert st[owner]["sessionHits"] == hits + 1
    finally:
        for s in busy:
            s.close()
    assert a + b == one(srv, "inst-sess-whole", n=20)


def test_an_adapter_loaded_at_run_time_serves_on_every_instance(srv, tiny_model, tmp_path_factory):
    from mindie_service.devkit.lora import build_demo_lora
    path = build_demo_lora(str(tiny_model), str(tmp_path_factory.mktemp("inst-lora") / "a"), rank=4, seed=3)
    r = srv.post("/v1/load_lora_adapter", {"lora_name": "inst-a", "lora_path": str(path)}, "management")
    assert r.status_code == 200, r.text
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 12, "do_sample": False, "adapter_id": "inst-a"}}
    before = [i["requests"]["routed"] for i in instances(srv)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: srv.post("/", body), range(4)))
    routed = [i["requests"]["routed"] - b for i, b in zip(instances(srv), before)]
    assert [g.status_code for g in got] == [200] * 4 and min(routed) >= 1, routed  # both instances served it
    texts = {g.json()[0]["generated_text"] for g in got}
    assert len(texts) == 1 and texts != {generate(srv, PROMPT, 12)}  # the same adapter everywhere, not the base
    r = srv.post("/v1/unload_lora_adapter", {"lora_name": "inst-a"}, "management")
    assert r.status_code == 200, r.text
    for _ in range(2):  # gone from every instance
        assert srv.post("/", body).status_code == 422

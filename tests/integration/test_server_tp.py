"""A server with worldSize 2 and npuDeviceIds [[0, 1]] (two rank processes on the CPU, gloo): greedy
tokens equal one rank's on the 16-prompt parity set (a flip only where one rank's top two logits tie
within 1e-5, compared up to it: see tests/unit/test_tensor_parallel.py), and a worker killed
mid-stream ends that stream with a 5xx error frame, turns /health 503 and leaves nothing hanging."""
from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest
import requests

from mindie_service import LLM, SamplingParams
from tests.server_utils import ServerProcess, launch, sse_frames, wait_until, write_config
from tests.unit.test_tensor_parallel import assert_same_up_to_ties, parity_prompts

MAX_TOKENS = 16
SCHEDULE = {"cacheBlockSize": 16, "numKvBlocks": 256, "maxBatchSize": 16, "maxPrefillBatchSize": 16}


@pytest.fixture(scope="module")
def srv(tiny_model, tmp_path_factory):
    def make() -> ServerProcess:
        d = tmp_path_factory.mktemp("tp")
        cfg = write_config(d / "config.json", tiny_model, schedule=SCHEDULE,
                           deploy={"ModelConfig": [{"modelName": "tiny", "modelWeightPath": str(tiny_model),
                                                    "worldSize": 2}]})
        doc = json.loads(cfg.read_text())
        doc["BackendConfig"]["npuDeviceIds"] = [[0, 1]]
        cfg.write_text(json.dumps(doc))
        return ServerProcess(cfg, d / "server.log")
    server = launch(make)
    yield server
    server.stop()


def _worker_pid(server_pid: int) -> int:
    """The spawned rank-1 process among the server's children (not multiprocessing's resource tracker)."""
    kids = []
    for task in os.listdir(f"/proc/{server_pid}/task"):
        kids += Path(f"/proc/{server_pid}/task/{task}/children").read_text().split()
    for pid in kids:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        if b"spawn_main" in cmd:
            return int(pid)
    raise AssertionError(f"no spawned rank among the server's children {kids}")


def test_server_with_two_ranks_gives_one_ranks_greedy_tokens(srv, tiny_model):
    assert srv.get("/v1/config", "management").json()["worldSize"] == 2
    prompts = parity_prompts()

    def ask(p: str) -> list[int]:
        r = srv.post("/", {"inputs": p, "parameters": {"max_new_tokens": MAX_TOKENS, "details": True,
                                                         "do_sample": False}})
        assert r.status_code == 200, r.text
        return [t["id"] for t in r.json()[0]["details"]["tokens"]]

    results: dict[int, list[int]] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, ask(prompts[i]))) for i in range(16)]
    for t in threads:  # concurrently: the ranks run batched steps
        t.start()
    for t in threads:
        t.join()
    ref = LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=256, max_seq_len=512, max_batch_size=16)
    want = ref.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=2), use_tqdm=False)
    want_pairs = [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in want]
    got_pairs = [(results[i], None) for i in range(16)]
    assert assert_same_up_to_ties(got_pairs, want_pairs) <= 1


def test_a_killed_rank_fails_the_stream_with_a_5xx_and_health_turns_503(srv):
    body = {"inputs": parity_prompts()[0], "stream": True,
            "parameters": {"max_new_tokens": 400, "do_sample": False}}
    with requests.post(srv.url() + "/", json=body, stream=True, timeout=60) as r:
        assert r.status_code == 200
        frames = sse_frames(r)
        assert "token" in next(frames)  # mid-generation
        os.kill(_worker_pid(srv.proc.pid), signal.SIGKILL)
        rest = list(frames)  # ends: an error frame, not a hang (the read timeout would fail the test)
    assert rest and rest[-1].get("error_type") == "incomplete_generation", rest[-1:]
    assert wait_until(lambda: srv.get("/health", "management").status_code == 503, timeout=30)
    r = srv.post("/", {"inputs": "hello", "parameters": {"max_new_tokens": 4}}, timeout=30)
    assert r.status_code >= 500
    assert srv.proc.poll() is None  # the server itself stays up to answer (and report) 503s

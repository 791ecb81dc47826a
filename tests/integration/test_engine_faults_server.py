"""Faults injected into the engine step of a real server (devkit/faults.py, env MINDIE_SERVICE_FAULTS).

- A request that makes the step raise fails alone with a 424; its neighbours (greedy ones and a seeded
  sampled one) give the very output of a run without the fault, and the server goes on serving.
- The engine thread dying fails every request in flight at once with a 500 ``incomplete_generation`` (an
  error frame for a stream already under way) instead of leaving them to their timeouts, turns /health
  503, and the process exits with code 3 so that a supervisor restarts it."""
from __future__ import annotations

import concurrent.futures as cf
from pathlib import Path

import pytest
import requests

from tests.server_utils import ServerProcess, launch, sse_frames, wait_until, write_config

FAIL, KILL = "zqxfailq", "zqxdieq"  # markers: words no test prompt contains
LONG = {"max_new_tokens": 3000}  # far longer than each test holds a request


def faulty_server(tmp: Path, tiny_model: Path, spec: str) -> ServerProcess:
    def make() -> ServerProcess:
        cfg = write_config(tmp / "config.json", tiny_model, deploy={"maxSeqLen": 4096, "maxInputTokenLen": 256},
                           schedule={"maxIterTimes": 4000, "numKvBlocks": 800, "maxPrefillTokens": 4096})
        return ServerProcess(cfg, tmp / "server.log")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINDIE_SERVICE_FAULTS", spec)  # ServerProcess.start passes the environment on
        return launch(make)


@pytest.fixture(scope="module")
def fail_srv(tiny_model, tmp_path_factory):
    srv = faulty_server(tmp_path_factory.mktemp("faults_fail"), tiny_model, f"fail_request={FAIL}")
    yield srv
    srv.stop()


def generate(srv: ServerProcess, prompt: str, **params) -> requests.Response:
    return srv.post("/", {"inputs": prompt, "parameters": {"max_new_tokens": 24, **params}})


NEIGHBOURS = [("The lantern by the harbor window", {}), ("River mountain city garden", {}),
              ("Quiet market morning", {"do_sample": True, "temperature": 0.9, "top_k": 20, "seed": 4321})]


def test_a_request_that_breaks_the_step_fails_alone_and_the_others_are_unchanged(fail_srv):
    log = fail_srv.log()
    assert "FAULT INJECTION ACTIVE" in log and "WARNING" in log  # the hook says so at start-up
    clean = [generate(fail_srv, p, **kw) for p, kw in NEIGHBOURS]
    assert all(r.status_code == 200 for r in clean), [r.text for r in clean]
    clean_texts = [r.json()[0]["generated_text"] for r in clean]
    jobs = [(f"Silver {FAIL} winter bridge", {})] + NEIGHBOURS + [(f"Orange {FAIL} violin", {"max_new_tokens": 3})]
    for _ in range(3):  # the bad requests land in different steps (prefill, beside decodes) each round
        with cf.ThreadPoolExecutor(len(jobs)) as ex:
            outs = list(ex.map(lambda j: generate(fail_srv, j[0], **j[1]), jobs))
        for bad in (outs[0], outs[-1]):
            assert bad.status_code == 424 and bad.json()["error_type"] == "generation", bad.text
            assert "injected" not in bad.json()["error"]  # the cause stays in the log
        assert [r.status_code for r in outs[1:-1]] == [200, 200, 200], [r.text for r in outs]
        assert [r.json()[0]["generated_text"] for r in outs[1:-1]] == clean_texts
    assert fail_srv.get("/health", "management").status_code == 200
    assert wait_until(lambda: fail_srv.status()["requests"]["running"] == 0)
    st = fail_srv.status()
    assert st["blocks"]["free"] == st["blocks"]["total"]  # the failed requests' blocks came back


def test_a_streamed_request_that_breaks_the_step_gets_an_error_frame_or_424(fail_srv):
    r = requests.post(fail_srv.url() + "/", json={"inputs": f"Pilot {FAIL} ocean", "stream": True,
                                                   "parameters": {"max_new_tokens": 8}}, stream=True, timeout=60)
    # The step fails at the prompt, before any token: a plain 424, never a 200 that breaks off.
    assert r.status_code == 424 and r.json()["error_type"] == "generation"
    assert generate(fail_srv, "River mountain city garden").status_code == 200  # still serving


def test_engine_death_fails_in_flight_requests_at_once_turns_health_503_and_exits_3(tiny_model, tmp_path):
    srv = faulty_server(tmp_path, tiny_model, f"kill_engine={KILL}")
    try:
        streams = []
        for prompt in ("The lantern by the harbor window", "River mountain city garden"):
            resp = requests.post(srv.url() + "/", json={"inputs": prompt, "stream": True, "parameters": LONG},
                                 stream=True, timeout=120)
            assert resp.status_code == 200, resp.text
            frames = sse_frames(resp)
            assert "token" in next(frames)  # generation under way
            streams.append((resp, frames))
        with cf.ThreadPoolExecutor(2) as ex:
            plain = ex.submit(generate, srv, "Quiet market morning", **LONG)
            assert wait_until(lambda: srv.status()["requests"]["running"] == 3, timeout=60), srv.status()
            killer = generate(srv, f"Candle {KILL} meadow")
            # Within the grace period before the exit (5 s): asked first, before anything else is read.
            health = srv.get("/health", "management").status_code
            ready = srv.get("/v2/health/ready", "management").status_code
            refused = generate(srv, "River mountain city garden")
            plain = plain.result(timeout=120)
        for r in (killer, plain):
            assert r.status_code == 500 and r.json()["error_type"] == "incomplete_generation", r.text
        for resp, frames in streams:
            rest = list(frames)  # the stream ends after its error frame
            assert rest and rest[-1]["error_type"] == "incomplete_generation", rest[-3:]
            assert all("token" in f for f in rest[:-1]) and len(rest) < 3000
            resp.close()
        assert (health, ready) == (503, 503)
        assert refused.status_code == 503, refused.text
        assert srv.proc.wait(timeout=90) == 3  # a supervisor restarts it
        log = srv.log_path.read_text(errors="replace")
        assert "CRITICAL" in log and "exiting with code 3" in log
    finally:
        srv.stop()

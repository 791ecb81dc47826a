"""`mindie-service serve MODEL --port P --max-model-len N --api-key K` in a process of its own, as a vLLM
Deployment's command would start it: it serves the model under its folder's name on port P (vLLM's /metrics there
too), asks for the key, and holds prompts to the model length N."""
from __future__ import annotations

from pathlib import Path

import pytest
import requests

from tests.server_utils import ServerProcess, free_port, launch, write_config

KEY = "vllm-style-key-1"


@pytest.fixture(scope="module")
def flagged(tmp_path_factory, tiny_model: Path):
    tmp = tmp_path_factory.mktemp("vllmflags")
    port = free_port()
    cfg = write_config(tmp / "config.json", tmp / "not-this-model", model_name="other")

    def make() -> ServerProcess:
        return ServerProcess(cfg, tmp / "server.log",
                             args=(str(tiny_model), "--port", str(port), "--max-model-len", "64", "--api-key", KEY))
    srv = launch(make)
    srv.base = f"http://127.0.0.1:{port}"
    yield srv
    srv.stop()


@pytest.mark.slow
def test_serve_model_with_vllm_flags(flagged):
    base, auth = flagged.base, {"Authorization": f"Bearer {KEY}"}
    body = {"model": "tiny", "prompt": "the mill by the river", "max_tokens": 4, "temperature": 0}
    assert requests.post(base + "/v1/completions", json=body, timeout=60).status_code == 401
    r = requests.post(base + "/v1/completions", json=body, headers=auth, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "tiny" and r.json()["usage"]["completion_tokens"] == 4
    models = requests.get(base + "/v1/models", headers=auth, timeout=30).json()
    assert [m["id"] for m in models["data"]][:1] == ["tiny"]
    long = dict(body, prompt="word " * 80)  # past --max-model-len 64
    r = requests.post(base + "/v1/completions", json=long, headers=auth, timeout=60)
    assert r.status_code == 400 and "at most 63 tokens" in r.json()["error"]["message"], r.text  # 64 - 1
    metrics = requests.get(base + "/metrics", timeout=30).text  # vLLM's /metrics on its serving port
    assert 'vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 1.0' in metrics

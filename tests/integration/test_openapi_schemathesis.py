"""Schemathesis against /openapi.json of a running server (StandardMock: the frontend, no weights), at small
scale: every documented non-destructive operation, a few examples each. No 5xx, and no response that
breaks the document (status, content type, body schema). The catalog also holds stopped models (issue 46) that the
document names as examples: a copy of the tiny model, loaded on demand (maxLoadedModels 2: the default and it), and
one whose load fails (424, never a 5xx)."""
from __future__ import annotations

import os
from pathlib import Path

import shutil
import subprocess
import sys

import pytest

from tests.server_utils import ServerProcess, write_config

pytestmark = pytest.mark.slow
# One fixed seed, so that a run is repeatable and CI's verdict is the code's, not the draw's. Other seeds explore:
# MINDIE_ST_SEED=<n> (CI's seed 170468628235044265135265401331556255452 found the parked default model's /info 503).
SEED = os.environ.get("MINDIE_ST_SEED", "20261128")
# Destructive or state-changing routes stay out (the list, plus the batch-job and adapter routes); the
# catalog, adapter and stopService routes are management-port routes now, fuzzed by test_control_fuzz.py.
EXCLUDED = r"^/(stopService|v1/models/[^/]+/(stop|start)|v1/models/download/.*|v1/(load|unload)_lora_adapter" \
           r"|batch_inference/.*)$"


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model):
    tmp: Path = tmp_path_factory.mktemp("schemathesis")
    (tmp / "models").mkdir()
    shutil.copytree(tiny_model, tmp / "models" / "tiny2")
    (tmp / "models" / "broken").mkdir()
    shutil.copy(tiny_model / "config.json", tmp / "models" / "broken" / "config.json")
    (tmp / "models" / "broken" / "model.safetensors").write_bytes(b"not a safetensors file")
    cfg = write_config(tmp / "config.json", tiny_model, server={"maxLoadedModels": 2}, deploy={
        "modelsDir": str(tmp / "models"),
        "ModelConfig": [{"modelName": "tiny", "modelWeightPath": str(tiny_model), "modelInstanceType": "StandardMock"}]})
    s = ServerProcess(cfg, tmp / "server.log").start().wait_ready()
    yield s
    s.stop()


def test_no_5xx_and_responses_match_the_document(server, tmp_path):
    """The `st` CLI (schemathesis 4): examples, coverage and fuzzing phases, 15 examples per operation."""
    report = tmp_path / "st.txt"
    cmd = [str(Path(sys.executable).parent / "st"), "run", server.url() + "/openapi.json", "--max-examples", "15",
           "--exclude-path-regex", EXCLUDED, "--exclude-method", "DELETE", "--phases", "examples,coverage,fuzzing",
           "-c", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
           "--workers", "1", "--suppress-health-check", "all", "--no-color", "--seed", SEED]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    report.write_text(r.stdout + r.stderr)
    print(r.stdout[-4000:])
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert server.get("/health", "management").status_code == 200

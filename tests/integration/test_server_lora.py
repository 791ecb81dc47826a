"""LoRA over HTTP: static adapters from LoraModules, per-request adapter_id, load/use/unload at run time."""
from __future__ import annotations

from pathlib import Path

import pytest

from mindie_service import LLM, SamplingParams
from mindie_service.devkit.lora import build_demo_lora
from tests.server_utils import ServerProcess, shared_server, write_config

PROMPT = "River mountain city garden"
GREEDY = {"max_new_tokens": 12, "do_sample": False}


@pytest.fixture(scope="module")
def adapters(tiny_model, tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("loras")
    return {name: Path(build_demo_lora(str(tiny_model), str(d / name), rank=r, seed=s))
            for name, r, s in (("static-a", 4, 1), ("dyn-b", 8, 2))}


@pytest.fixture(scope="module")
def srv(request, tiny_model, adapters) -> ServerProcess:
    def make(tmp: Path) -> ServerProcess:
        cfg = write_config(tmp / "config.json", tiny_model, deploy={
            "maxLoras": 2, "maxLoraRank": 16,
            "LoraModules": [{"name": "static-a", "path": str(adapters["static-a"]), "baseModelName": "tiny"}]})
        return ServerProcess(cfg, tmp / "server.log")
    return shared_server("lora", request, make)


def _text(srv: ServerProcess, adapter: str) -> tuple[int, dict]:
    r = srv.post("/", {"inputs": PROMPT, "parameters": {**GREEDY, "adapter_id": adapter}})
    return r.status_code, r.json()


def test_static_adapter_changes_output_and_matches_the_offline_engine(srv, tiny_model, adapters):
    code, base = _text(srv, "None")
    code_a, with_a = _text(srv, "static-a")
    assert code == code_a == 200
    assert with_a[0]["generated_text"] != base[0]["generated_text"]
    llm = LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=128,
              lora_modules=(), max_loras=2, max_lora_rank=16)
    llm.engine.load_adapter("static-a", str(adapters["static-a"]))
    ref = llm.generate([PROMPT], SamplingParams(max_tokens=12, temperature=0.0), adapter_id="static-a",
                       use_tqdm=False)[0].outputs[0].text
    assert ref == with_a[0]["generated_text"]


def test_load_use_unload_then_refuse(srv, adapters):
    r = srv.post("/v1/load_lora_adapter", {"lora_name": "dyn-b", "lora_path": str(adapters["dyn-b"])},
                 plane="management")
    assert r.status_code == 200, r.text
    assert srv.post("/v1/load_lora_adapter", {"lora_name": "dyn-b", "lora_path": str(adapters["dyn-b"])},
                    plane="management").status_code == 409
    names = [m["id"] for m in srv.get("/v1/models").json()["data"]]
    assert {"tiny", "static-a", "dyn-b"} <= set(names)
    assert "dyn-b" in srv.get("/info").json()["adapters"]
    code, out = _text(srv, "dyn-b")
    assert code == 200
    r = srv.post("/v1/unload_lora_adapter", {"lora_name": "dyn-b"}, plane="management")
    assert r.status_code == 200, r.text
    code, err = _text(srv, "dyn-b")
    assert code == 422 and "dyn-b" in err["error"]
    assert _text(srv, "None")[0] == 200  # the server kept serving throughout


def test_bad_adapter_paths_are_422_and_unknown_unload_is_404(srv, tmp_path):
    r = srv.post("/v1/load_lora_adapter", {"lora_name": "ghost", "lora_path": str(tmp_path / "nope")},
                 plane="management")
    assert r.status_code == 422 and "ghost" in r.json()["error"]
    assert srv.post("/v1/unload_lora_adapter", {"lora_name": "ghost"}, plane="management").status_code == 404

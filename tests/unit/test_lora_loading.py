"""Adapter folders: validation at start-up and on dynamic load, the load/unload/list API (sync and
async, with requests in flight), PEFT scaling variants, and the deterministic demo builder."""
from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mindie_service import LLM, SamplingParams
from mindie_service.engine.async_engine import AsyncEngine
from mindie_service.engine.configs.engine_config import EngineConfig, LoraModuleSpec
from mindie_service.engine.contract import EngineRequest
from mindie_service.devkit.lora import build_demo_lora
from mindie_service.errors import ConflictError, NotFoundError, ValidationError

PROMPT = "River mountain city garden teacher window morning silver quiet market"
N = 24


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lora-load")


@pytest.fixture(scope="module")
def r8(tiny_model, root) -> str:
    return str(build_demo_lora(str(tiny_model), str(root / "r8"), rank=8, seed=1))


@pytest.fixture(scope="module")
def r16(tiny_model, root) -> str:
    return str(build_demo_lora(str(tiny_model), str(root / "r16"), rank=16, seed=2))


@pytest.fixture(scope="module")
def llm(tiny_model) -> LLM:
    return LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=128, max_loras=2, max_lora_rank=8)


def _params(adapter: str | None, n: int = N) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, adapter_id=adapter)


def _variant(src: str, dest: Path, config: dict | None = None, tensors=None) -> str:
    """Copy an adapter folder, then patch its config and/or its tensors."""
    shutil.copytree(src, dest)
    if config is not None:
        cfg = json.loads((dest / "adapter_config.json").read_text())
        cfg.update(config)
        (dest / "adapter_config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        t = tensors(load_file(str(dest / "adapter_model.safetensors")))
        save_file(t, str(dest / "adapter_model.safetensors"))
    return str(dest)


# ------------------------------------------------------------ bad adapters
def _other_base(tiny_model, root) -> str:
    """An adapter built for a base with another hidden size."""
    base = root / "other-base"
    base.mkdir(exist_ok=True)
    cfg = json.loads((Path(tiny_model) / "config.json").read_text())
    cfg.update(hidden_size=96, intermediate_size=256, head_dim=24)
    (base / "config.json").write_text(json.dumps(cfg))
    return str(build_demo_lora(str(base), str(root / "other"), rank=4, seed=0))


def test_bad_static_adapters_stop_start_up(tiny_model, root, r16):
    cases = [
        (LoraModuleSpec("ghost", str(root / "missing")), "not an existing folder"),
        (LoraModuleSpec("too-big", r16), "exceeds maxLoraRank"),
        (LoraModuleSpec("foreign", _other_base(tiny_model, root)), "different base model"),
    ]
    for spec, why in cases:
        with pytest.raises(ValueError, match=rf"LoRA adapter '{spec.name}'.*{why}"):
            LLM(str(tiny_model), num_kv_blocks=16, max_lora_rank=8, lora_modules=(spec,))


@pytest.mark.parametrize("case, why", [
    ("missing path", "not an existing folder"),
    ("no config", "adapter_config.json not found"),
    ("no weights", "adapter_model.safetensors not found"),
    ("rank over the cap", "rank 16 .* exceeds maxLoraRank \\(8\\)"),
    ("unsupported target in config", "unsupported target modules \\['embed_tokens'\\]"),
    ("unsupported tensor", "unsupported tensor 'base_model.model.lm_head.lora_A.weight'"),
    ("half a pair", "lacks lora_B"),
    ("dora", "DoRA"),
    ("rank differs from config", "adapter_config.json says 4"),
])
def test_bad_dynamic_loads_are_validation_errors(llm, root, r8, r16, case, why):
    folder = root / f"bad-{case.replace(' ', '-')}"
    make = {
        "missing path": lambda: str(folder),
        "no config": lambda: (_variant(r8, folder), (folder / "adapter_config.json").unlink())[0],
        "no weights": lambda: (_variant(r8, folder), (folder / "adapter_model.safetensors").unlink())[0],
        "rank over the cap": lambda: r16,
        "unsupported target in config": lambda: _variant(r8, folder, {"target_modules": ["q_proj", "embed_tokens"]}),
        "unsupported tensor": lambda: _variant(r8, folder, tensors=lambda t: {
            **t, "base_model.model.lm_head.lora_A.weight": torch.zeros(8, 128)}),
        "half a pair": lambda: _variant(r8, folder, tensors=lambda t: {
            k: v for k, v in t.items() if k != "base_model.model.model.layers.1.mlp.up_proj.lora_B.weight"}),
        "dora": lambda: _variant(r8, folder, {"use_dora": True}),
        "rank differs from config": lambda: _variant(r8, folder, {"r": 4}),
    }
    path = make[case]()
    with pytest.raises(ValidationError, match=f"LoRA adapter 'bad'.*{why}") as err:
        llm.engine.load_adapter("bad", path)
    assert err.value.status == 422
    assert "bad" not in llm.engine.lora.names()


# ------------------------------------------------------------ the load / unload / list API
def test_load_unload_list_and_errors(llm, r8):
    eng = llm.engine
    info = eng.load_adapter("mine", r8)
    assert info["name"] == "mine" and info["rank"] == 8 and info["in_use"] == 0
    assert [a["name"] for a in eng.list_adapters()] == ["mine"]
    with pytest.raises(ConflictError, match="'mine' is already loaded") as err:
        eng.load_adapter("mine", r8)
    assert err.value.status == 409
    with pytest.raises(ValidationError, match="Parameter lora_name"):
        eng.load_adapter("has space", r8)
    with pytest.raises(NotFoundError, match="'nope'"):
        eng.unload_adapter("nope")
    with pytest.raises(ValidationError, match="adapter_id must name a loaded LoRA adapter.*'nope'") as err:
        llm.generate([PROMPT], _params("nope"), use_tqdm=False)
    assert err.value.status == 422
    base = llm.generate([PROMPT], _params(None), use_tqdm=False)[0].outputs[0].token_ids
    assert llm.generate([PROMPT], _params("None"), use_tqdm=False)[0].outputs[0].token_ids == base
    assert llm.generate([PROMPT], _params("mine"), use_tqdm=False)[0].outputs[0].token_ids != base
    eng.unload_adapter("mine")
    assert eng.list_adapters() == []


def test_unload_is_refused_while_a_request_uses_the_adapter(llm, r8, root):
    eng = llm.engine
    eng.load_adapter("busy", r8)
    ref = llm.generate([PROMPT], _params("busy"), use_tqdm=False)[0].outputs[0].token_ids
    ids = llm.tokenizer(PROMPT).input_ids
    eng.add_request(EngineRequest("inflight", ids, _params("busy")))
    out: list[int] = []
    for _ in range(3):
        out += [ev.token.id for ev in eng.step()]
    with pytest.raises(ConflictError, match="'busy' is in use by 1 request"):
        eng.unload_adapter("busy")
    other = build_demo_lora(str(llm.engine.cfg.model), str(root / "other-r4"), rank=4, seed=5)
    eng.load_adapter("other", str(other))  # others come and go while the request runs
    eng.unload_adapter("other")
    while eng.has_work():
        out += [ev.token.id for ev in eng.step()]
    assert out == ref
    eng.unload_adapter("busy")


def test_adapter_may_not_take_the_served_model_name(tiny_model, r8):
    llm = LLM(str(tiny_model), num_kv_blocks=16, max_lora_rank=8, model_name="served")
    with pytest.raises(ValidationError, match="'served'.*differ from the served model"):
        llm.engine.load_adapter("served", r8)


def test_static_adapters_are_resident_at_start(tiny_model, r8):
    llm = LLM(str(tiny_model), num_kv_blocks=32, max_loras=2, max_lora_rank=8,
              lora_modules=(LoraModuleSpec("static", r8, "tiny"),))
    assert [(a["name"], a["resident"]) for a in llm.engine.list_adapters()] == [("static", True)]
    assert llm.engine.lora.pool.loads == 1


# ------------------------------------------------------------ PEFT scaling variants
@pytest.mark.parametrize("patch", [
    {"alpha_pattern": {"q_proj": 2.0, "mlp.down_proj": 40.0}},
    {"use_rslora": True},
], ids=["alpha_pattern", "rslora"])
def test_scaling_variants_match_peft(tiny_model, root, r8, patch):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder = _variant(r8, root / f"scaling-{next(iter(patch))}", patch)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    ids = tok(PROMPT, return_tensors="pt").input_ids
    hf = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32), folder).eval()
    with torch.inference_mode():
        gen = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=N, min_new_tokens=N,
                          do_sample=False, pad_token_id=tok.pad_token_id)
    plain = LLM(str(tiny_model), num_kv_blocks=32, max_lora_rank=8)
    plain.engine.load_adapter("v", folder)
    plain.engine.load_adapter("plain", r8)
    ours = plain.generate([PROMPT], _params("v"), use_tqdm=False)[0].outputs[0].token_ids
    assert ours == gen[0, ids.shape[1]:].tolist()
    assert ours != plain.generate([PROMPT], _params("plain"), use_tqdm=False)[0].outputs[0].token_ids


# ------------------------------------------------------------ async facade
def test_async_engine_keeps_inflight_adapter_while_others_load_and_unload(tiny_model, r8, root):
    eng = AsyncEngine(EngineConfig(model=str(tiny_model), cache_block_size=4, num_kv_blocks=128, max_loras=2,
                                   max_lora_rank=8))
    eng.start()
    other = str(build_demo_lora(str(tiny_model), str(root / "async-other"), rank=4, seed=9))

    def req(rid: str, adapter: str | None, n: int = 256) -> EngineRequest:
        return EngineRequest(rid, eng.tokenize(PROMPT), _params(adapter, n))

    async def main():
        await eng.load_adapter("a", r8)
        ref = [ev.token.id async for ev in eng.generate(req("ref", "a"))]
        tokens, churn = [], 0
        async for ev in eng.generate(req("live", "a")):
            tokens.append(ev.token.id)
            if ev.index == 0:  # 255 tokens to go: certainly still running
                with pytest.raises(ConflictError, match="'a' is in use"):
                    eng.unload_adapter("a")
            if ev.index % 8 == 2 and churn < 4:  # load, use and unload another adapter mid-stream
                await eng.load_adapter("b", other)
                [t async for t in eng.generate(req(f"b{ev.index}", "b", 4))]
                eng.unload_adapter("b")
                churn += 1
        with pytest.raises(ValidationError, match="'b'"):
            [t async for t in eng.generate(req("gone", "b", 4))]
        return ref, tokens, churn

    try:
        ref, tokens, churn = asyncio.run(main())
        assert tokens == ref and churn >= 4
        assert eng.adapter_names() == ["a"]
        eng.unload_adapter("a")
        assert eng.list_adapters() == []
    finally:
        eng.shutdown()


# ------------------------------------------------------------ demo builder
def test_demo_lora_is_deterministic_and_loads_in_peft(tiny_model, root):
    from mindie_service.cli import main
    a = build_demo_lora(str(tiny_model), str(root / "det-a"), rank=4, seed=3)
    assert main(["demo-lora", "--base", str(tiny_model), "--out", str(root / "det-b"), "--rank", "4",
                 "--seed", "3"]) == 0
    c = build_demo_lora(str(tiny_model), str(root / "det-c"), rank=4, seed=4)
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        assert (a / f).read_bytes() == (root / "det-b" / f).read_bytes()
    assert (a / "adapter_model.safetensors").read_bytes() != (c / "adapter_model.safetensors").read_bytes()
    cfg = json.loads((a / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and set(cfg["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                             "up_proj", "down_proj"}
    assert all(v.abs().sum() > 0 for v in load_file(str(a / "adapter_model.safetensors")).values())

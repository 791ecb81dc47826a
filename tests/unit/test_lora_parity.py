"""LoRA through our engine is token-identical to transformers + peft, alone and in mixed batches."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mindie_service import LLM, SamplingParams
from mindie_service.devkit.lora import build_demo_lora
from tests.prompts import word_prompts

MAX_TOKENS = 32
RANKS = (4, 8, 16)


@pytest.fixture(scope="module")
def adapters(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    return {f"r{r}": str(build_demo_lora(str(tiny_model), str(root / f"r{r}"), rank=r, seed=r)) for r in RANKS}


@pytest.fixture(scope="module")
def prompts():
    return word_prompts(4, 3, 60, seed=7)


@pytest.fixture(scope="module")
def reference(tiny_model, adapters, prompts):
    """transformers (+ PeftModel) greedy output per (adapter or None, prompt): 32 tokens, EOS ignored."""
    from peft import PeftModel
    tok = AutoTokenizer.from_pretrained(tiny_model)

    def run(model) -> list[list[int]]:
        outs = []
        with torch.inference_mode():
            for p in prompts:
                ids = tok(p, return_tensors="pt").input_ids
                gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                                     min_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=tok.pad_token_id)
                outs.append(gen[0, ids.shape[1]:].tolist())
        return outs

    ref = {None: run(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval())}
    for name, path in adapters.items():
        base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
        ref[name] = run(PeftModel.from_pretrained(base, path).eval())
    return ref


def _params(adapter: str | None) -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, adapter_id=adapter)


def test_demo_adapters_change_outputs(reference):
    # Guard: an adapter that left outputs equal to the base model's would prove nothing below.
    for name in reference:
        if name is not None:
            assert all(a != b for a, b in zip(reference[name], reference[None])), name


@pytest.mark.parametrize("rank", RANKS)
def test_each_rank_matches_peft(tiny_model, adapters, prompts, reference, rank):
    name = f"r{rank}"
    llm = LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=256, max_loras=1, max_lora_rank=16)
    llm.engine.load_adapter(name, adapters[name])
    outs = llm.generate(prompts, _params(None), use_tqdm=False, adapter_id=name)
    assert [o.outputs[0].token_ids for o in outs] == reference[name]


def test_mixed_batch_of_24_matches_each_request_alone(tiny_model, adapters, prompts, reference):
    """24 requests over base + 3 adapters in one continuous batch (same prompts under different adapters
    side by side), against transformers+peft and against each request run alone."""
    names = [None, *adapters]
    jobs = [(names[i % 4], prompts[(i // 4) % len(prompts)]) for i in range(24)]
    llm = LLM(str(tiny_model), cache_block_size=4, num_kv_blocks=1024, max_batch_size=32, max_loras=3,
              max_lora_rank=16)
    for name, path in adapters.items():
        llm.engine.load_adapter(name, path)
    batched = [o.outputs[0].token_ids
               for o in llm.generate([p for _, p in jobs], [_params(a) for a, _ in jobs], use_tqdm=False)]
    assert batched == [reference[a][prompts.index(p)] for a, p in jobs]
    alone_llm = LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=256, max_loras=3, max_lora_rank=16,
                    enable_prefix_caching=False)
    for name, path in adapters.items():
        alone_llm.engine.load_adapter(name, path)
    for (a, p), out in zip(jobs, batched):
        assert alone_llm.generate([p], _params(a), use_tqdm=False)[0].outputs[0].token_ids == out
    assert llm.engine.stats().free_blocks == llm.engine.blocks.num_blocks
    assert all(a["in_use"] == 0 for a in llm.engine.list_adapters())


def test_partial_targets_and_layers_match_peft(tiny_model, tmp_path, prompts):
    """q and v without k, up without gate, layer 2 untouched: packed slices must land in the right columns."""
    import json

    from peft import PeftModel
    from safetensors.torch import load_file, save_file
    path = build_demo_lora(str(tiny_model), str(tmp_path / "partial"), rank=8, seed=11,
                           targets=("q_proj", "v_proj", "up_proj", "o_proj"))
    weights = load_file(str(path / "adapter_model.safetensors"))
    save_file({k: v for k, v in weights.items() if ".layers.2." not in k}, str(path / "adapter_model.safetensors"))
    cfg = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**cfg, "layers_to_transform": [0, 1, 3]}))
    tok = AutoTokenizer.from_pretrained(tiny_model)
    hf = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32), str(path))
    ref = []
    with torch.inference_mode():
        for p in prompts[:2]:
            ids = tok(p, return_tensors="pt").input_ids
            gen = hf.eval().generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                                     min_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=tok.pad_token_id)
            ref.append(gen[0, ids.shape[1]:].tolist())
    llm = LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=128, max_lora_rank=8)
    info = llm.engine.load_adapter("partial", str(path))
    assert info["targets"] == ["q_proj", "v_proj", "o_proj", "up_proj"]
    outs = llm.generate(prompts[:2], _params("partial"), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == ref

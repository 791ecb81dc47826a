"""Mistral and Qwen2 (qkv bias) checkpoints run token-identical to transformers, like Llama."""
from __future__ import annotations

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, MistralConfig, Qwen2Config

from mindie_service import LLM, SamplingParams
from tests.prompts import word_prompts

FAMILIES = {
    "qwen2": (Qwen2Config, {}),
    "mistral": (MistralConfig, {"sliding_window": None}),
}


def _build(kind: str, tiny_model, out):
    """A random checkpoint of this family with the tiny tokenizer, weights scaled like the demo models."""
    cls, extra = FAMILIES[kind]
    cfg = cls(vocab_size=2048, hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=False,
              bos_token_id=1, eos_token_id=2, pad_token_id=3, **extra)
    torch.manual_seed(7)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                continue
            fan_in = p.shape[-1] if p.dim() > 1 else 128
            std = {"embed_tokens": 1.0, "lm_head": 4 / 128 ** 0.5}.get(next((k for k in ("embed_tokens", "lm_head")
                                                                            if k in name), ""), 1.0 / fan_in ** 0.5)
            p.normal_(0, std * (2.0 if "q_proj" in name or "k_proj" in name else 1.0))
    model.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model / f, out / f)
    return model


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_family_matches_transformers(kind, tiny_model, tmp_path):
    hf = _build(kind, tiny_model, tmp_path).eval()
    if kind == "qwen2":
        assert hf.model.layers[0].self_attn.q_proj.bias is not None and hf.model.layers[0].self_attn.o_proj.bias is None
    tok = AutoTokenizer.from_pretrained(tmp_path)
    prompts = word_prompts(4, 3, 60, seed=5)
    ref = []
    with torch.inference_mode():
        for p in prompts:
            ids = tok(p, return_tensors="pt").input_ids
            gen = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, min_new_tokens=24,
                              do_sample=False, pad_token_id=3)
            ref.append(gen[0, ids.shape[1]:].tolist())
    llm = LLM(str(tmp_path), cache_block_size=8, num_kv_blocks=128, max_seq_len=512)
    got = llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == ref
    assert llm.engine.architecture == hf.config.architectures[0]

"""The checks weights kept packed must pass, written once. A GGUF file loaded packed (test_gguf_packed_load.py,
test_gguf_kquant_load.py): every linear and the tied head read the file's blocks, and teacher-forced log-probs equal
the file dequantized at load within 1e-4. An engine over packed weights (GGUF blocks: test_gguf_engine.py; W4A16's
int4: test_w4a16_engine.py): the fused one-call decode step gives the op-by-op step's tokens and log-probs bit for
bit; multi-step bursts and n-gram speculation keep the tokens; a LoRA adapter added after the packed matmul matches
the same adapter over the file dequantized at load (greedy tokens equal, log-probs within 1e-4: fp32 accumulation
order only)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from mindie_service import LLM, SamplingParams
from mindie_service.devkit.quant_eval import compare, teacher_forced_logprobs
from mindie_service.engine.runner.model_runner import ModelRunner
from mindie_service.models import fused_layers, gguf_packed
from npu_ops.gguf_modules import GgufEmbedding, GgufLinear
from tests.unit.test_fused_decode import count_fused_steps

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1,
         "dynamic": False}


def all_packed(m: Any) -> None:
    """Every projection, the embeddings and the tied head of model ``m`` read the file's blocks."""
    assert isinstance(m.embed_tokens, GgufEmbedding) and isinstance(m.lm_head, GgufLinear)
    assert m.lm_head.parts[0] is m.embed_tokens.weight_q  # the tied head reads the embeddings' bytes
    assert all(isinstance(mod, GgufLinear) for layer in m.layers
               for mod in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj))


def matches_the_dequantized_load(f: Path, tokens: list[int], seq_len: int, label: str) -> None:
    """Teacher-forced log-probs of ``f`` loaded packed against the same file dequantized at load."""
    ref = teacher_forced_logprobs(f, tokens, seq_len=seq_len, chunk=16, gguf_packed=False)
    got = teacher_forced_logprobs(f, tokens, seq_len=seq_len, chunk=16)
    assert (got - ref).abs().max() < 1e-4
    agree = compare(label, ref, got, torch.tensor(tokens[1:]))
    assert agree.top1_agreement == 1.0 and agree.mean_kl < 1e-8, agree


def generate(llm: LLM, prompts: list[list[int]], adapter: str | None = None) -> list[tuple]:
    """(tokens, log-probs of the top 3 at each step) of each prompt, 12 greedy tokens past EOS."""
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=3)
    out = llm.generate(prompts, [params] * len(prompts), use_tqdm=False, adapter_id=adapter)
    return [(list(o.outputs[0].token_ids), [dict(lp) for lp in o.outputs[0].logprobs]) for o in out]


def fused_step_is_op_by_op(llm: LLM, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch) -> None:
    calls = count_fused_steps(monkeypatch)
    fused = generate(llm, prompts)
    assert sum(calls) >= 11  # the decode steps took the C call
    monkeypatch.setattr(ModelRunner, "_fused_decode", lambda self, decodes: None)
    assert generate(llm, prompts) == fused
    fused_layers.set_enabled(False)  # every layer op by op: the same bits
    try:
        assert generate(llm, prompts) == fused
    finally:
        fused_layers.set_enabled(True)


def bursts_and_speculation_keep_the_tokens(make: Callable[..., LLM], prompts: list[list[int]],
                                           plain: LLM | None = None) -> None:
    """``make(**engine_args)`` builds the engine under test (``plain``: one already made without extra args)."""
    one = generate(plain or make(), prompts)
    assert generate(make(decode_steps=4), prompts) == one
    assert [t for t, _ in generate(make(speculative_config=NGRAM), prompts)] == [t for t, _ in one]


def lora_after_the_packed_matmul(path: str, adapter: str, prompts: list[list[int]], pool: dict[str, Any],
                                 monkeypatch: pytest.MonkeyPatch) -> LLM:
    """The adapter on ``path`` kept packed against the same file dequantized at load; the packed engine back."""
    packed = LLM(path, dtype="float32", max_loras=1, max_lora_rank=8, **pool)
    packed.engine.load_adapter("a", adapter)
    got, base = generate(packed, prompts, "a"), generate(packed, prompts)
    monkeypatch.setattr(gguf_packed, "keep_packed", lambda *a, **k: False)
    dense = LLM(path, dtype="float32", max_loras=1, max_lora_rank=8, **pool)
    assert not isinstance(dense.engine.runner.model.layers[0].mlp.down_proj, GgufLinear)
    dense.engine.load_adapter("a", adapter)
    want = generate(dense, prompts, "a")
    assert [t for t, _ in got] == [t for t, _ in want] and [t for t, _ in got] != [t for t, _ in base]
    worst = max(abs(a[k] - b[k]) for (_, la), (_, lb) in zip(got, want)
                for a, b in zip(la, lb) for k in a if k in b)
    assert worst < 1e-4
    return packed

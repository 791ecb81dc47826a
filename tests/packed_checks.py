"""The checks an engine over weights kept packed (GGUF blocks: tests/unit/test_gguf_engine.py; W4A16's int4:
test_w4a16_engine.py) must pass, written once: the fused one-call decode step gives the op-by-op step's tokens and
log-probs bit for bit; multi-step bursts and n-gram speculation keep the tokens; a LoRA adapter added after the
packed matmul matches the same adapter over the file dequantized at load (greedy tokens equal, log-probs within
1e-4: fp32 accumulation order only)."""
from __future__ import annotations

from typing import Any, Callable

import pytest

from mindie_service import LLM, SamplingParams
from mindie_service.engine.runner.model_runner import ModelRunner
from mindie_service.models import fused_layers, gguf_packed
from npu_ops.gguf_modules import GgufLinear
from tests.unit.test_fused_decode import count_fused_steps

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1,
         "dynamic": False}


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

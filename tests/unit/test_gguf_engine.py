"""The engine on GGUF weights kept as stored (models/gguf_packed.py): the demo tiny model written as a GGUF with its
linears in Q4_1, its v projections in Q8_0 (a qkv of two block types: two segments), the embeddings in Q8_0 and the
head in Q4_0. The fused decode step (one C call: the GGUF embedding rows, layers and head) gives the op-by-op
step's logits bit for bit; multi-step bursts give the single steps' tokens and log-probs; n-gram speculation keeps
the greedy tokens; a LoRA adapter is added after the packed base matmul and matches the same adapter over the file
dequantized at load (greedy tokens equal, log-probs within 1e-4: fp32 accumulation order only)."""
from __future__ import annotations

from pathlib import Path

import pytest

from mindie_service import LLM, SamplingParams
from mindie_service.devkit.lora import build_demo_lora
from mindie_service.engine.runner.model_runner import ModelRunner
from mindie_service.models import fused_layers, gguf_packed
from npu_ops import cpu_kernels
from npu_ops.gguf_modules import GgufEmbedding, GgufLinear
from tests.gguf_files import write_gguf
from tests.unit.test_fused_decode import count_fused_steps

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")

PROMPTS = [[5, 9, 13, 2, 7], list(range(3, 40)), [11] * 20]
POOL = dict(cache_block_size=4, num_kv_blocks=128, max_seq_len=256)


@pytest.fixture(scope="module")
def tiny_gguf(tiny_model, tmp_path_factory) -> Path:
    T = gguf.GGMLQuantizationType
    types = {"token_embd.weight": T.Q8_0, "output.weight": T.Q4_0}
    for b in range(4):
        types.update({f"blk.{b}.{n}.weight": T.Q4_1 for n in ("attn_q", "attn_k", "attn_output", "ffn_gate",
                                                               "ffn_up", "ffn_down")})
        types[f"blk.{b}.attn_v.weight"] = T.Q8_0
    return write_gguf(Path(tiny_model), tmp_path_factory.mktemp("gguf") / "tiny-q.gguf", types)


def _generate(llm: LLM, adapter: str | None = None, prompts: list[list[int]] = PROMPTS) -> list[tuple]:
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=3)
    out = llm.generate(prompts, [params] * len(prompts), use_tqdm=False, adapter_id=adapter)
    return [(list(o.outputs[0].token_ids), [dict(lp) for lp in o.outputs[0].logprobs]) for o in out]


def test_the_fused_decode_step_gives_the_op_by_op_logits(tiny_gguf, monkeypatch):
    llm = LLM(str(tiny_gguf), dtype="float32", **POOL)
    m = llm.engine.runner.model
    assert isinstance(m.embed_tokens, GgufEmbedding) and m.lm_head.kinds == ["Q4_0"]
    assert m.layers[0].self_attn.qkv_proj.kinds == ["Q4_1", "Q8_0"]
    calls = count_fused_steps(monkeypatch)
    fused = _generate(llm)
    assert sum(calls) >= 11  # the decode steps took the C call
    monkeypatch.setattr(ModelRunner, "_fused_decode", lambda self, decodes: None)
    assert _generate(llm) == fused
    fused_layers.set_enabled(False)  # every layer op by op: the same bits
    try:
        assert _generate(llm) == fused
    finally:
        fused_layers.set_enabled(True)


def test_bursts_and_speculation_keep_the_tokens(tiny_gguf):
    one = _generate(LLM(str(tiny_gguf), dtype="float32", **POOL))
    burst = LLM(str(tiny_gguf), dtype="float32", decode_steps=4, **POOL)
    assert _generate(burst) == one
    spec = LLM(str(tiny_gguf), dtype="float32", speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                                                    "prompt_lookup_max": 4, "prompt_lookup_min": 1,
                                                                    "dynamic": False}, **POOL)
    assert [t for t, _ in _generate(spec)] == [t for t, _ in one]


def test_lora_adds_its_delta_after_the_packed_matmul(tiny_model, tiny_gguf, tmp_path, monkeypatch):
    adapter = str(build_demo_lora(str(tiny_model), str(tmp_path / "lora"), rank=8, seed=3))
    packed = LLM(str(tiny_gguf), dtype="float32", max_loras=1, max_lora_rank=8, **POOL)
    assert isinstance(packed.engine.runner.model.layers[0].mlp.down_proj, GgufLinear)
    packed.engine.load_adapter("a", adapter)
    got, base = _generate(packed, "a"), _generate(packed)
    monkeypatch.setattr(gguf_packed, "keep_packed", lambda *a, **k: False)
    dense = LLM(str(tiny_gguf), dtype="float32", max_loras=1, max_lora_rank=8, **POOL)
    assert not isinstance(dense.engine.runner.model.layers[0].mlp.down_proj, GgufLinear)
    dense.engine.load_adapter("a", adapter)
    want = _generate(dense, "a")
    assert [t for t, _ in got] == [t for t, _ in want] and [t for t, _ in got] != [t for t, _ in base]
    worst = max(abs(a[k] - b[k]) for (_, la), (_, lb) in zip(got, want)
                for a, b in zip(la, lb) for k in a if k in b)
    assert worst < 1e-4

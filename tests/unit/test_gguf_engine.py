"""The engine on GGUF weights kept as stored (models/gguf_packed.py): the demo tiny model written as a GGUF with its
linears in Q4_1, its v projections in Q8_0 (a qkv of two block types: two segments), the embeddings in Q8_0 and the
head in Q4_0. The fused decode step (one C call: the GGUF embedding rows, layers and head) gives the op-by-op
step's logits bit for bit; multi-step bursts give the single steps' tokens and log-probs; n-gram speculation keeps
the greedy tokens; a LoRA adapter is added after the packed base matmul and matches the same adapter over the file
dequantized at load (greedy tokens equal, log-probs within 1e-4: fp32 accumulation order only)."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

from mindie_service import LLM
from mindie_service.devkit.lora import build_demo_lora
from npu_ops import cpu_kernels
from npu_ops.gguf_modules import GgufEmbedding, GgufLinear
from tests import packed_checks
from tests.gguf_files import write_gguf

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


@pytest.mark.parametrize("activations", ["fp32", "int8"])
def test_the_fused_decode_step_gives_the_op_by_op_logits(tiny_gguf, monkeypatch, activations):
    # int8 activations in every call (prefill and decode alike): a later run that finds a prompt's blocks cached
    # prefills only its tail, and each row's result is its own, so the prefix cache stays on for both
    llm = LLM(str(tiny_gguf), dtype="float32", gguf_activations=activations, **POOL)
    m = llm.engine.runner.model
    # the 4-bit linears run with their rows 4 interleaved (npu_ops.quant_gguf_x4), the embeddings as stored
    assert isinstance(m.embed_tokens, GgufEmbedding) and m.lm_head.kinds == ["Q4_0x4"]
    assert m.layers[0].self_attn.qkv_proj.kinds == ["Q4_1x4", "Q8_0"]
    packed_checks.fused_step_is_op_by_op(llm, PROMPTS, monkeypatch)


@pytest.mark.parametrize("activations", ["fp32", "int8"])
def test_bursts_and_speculation_keep_the_tokens(tiny_gguf, activations):
    # int8: every call takes the int8 kernels, whatever the burst, the drafts or the rows a step holds
    packed_checks.bursts_and_speculation_keep_the_tokens(functools.partial(
        LLM, str(tiny_gguf), dtype="float32", gguf_activations=activations, **POOL), PROMPTS)


def test_lora_adds_its_delta_after_the_packed_matmul(tiny_model, tiny_gguf, tmp_path, monkeypatch):
    adapter = str(build_demo_lora(str(tiny_model), str(tmp_path / "lora"), rank=8, seed=3))
    # fp32 activations pinned: this guards the fp32 path, exact against the dequantized load to fp32 order
    packed = packed_checks.lora_after_the_packed_matmul(str(tiny_gguf), adapter, PROMPTS,
                                                        {**POOL, "gguf_activations": "fp32"}, monkeypatch)
    assert isinstance(packed.engine.runner.model.layers[0].mlp.down_proj, GgufLinear)

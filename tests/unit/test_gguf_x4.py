"""GGUF's 4-bit simple blocks with 4 weight rows interleaved (npu_ops/quant_gguf_x4.py, csrc/gguf_x4.h): the
layout as the header states it, every entry point's bits equal to the type's own kernel on the rows as GGUF stores
them (int8 and fp32 activations, the lone-row passes, the 8-row lanes, the prefill tiles, a team of 1 and 2), a load
that repacks a linear's rows and never an embedding's (a tied head stays one copy), and the lookups that cannot read
interleaved rows refused."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from mindie_service import LLM
from mindie_service.models import packed_arena
from npu_ops import cpu_kernels, gguf_cpu, quant_gguf_x4
from npu_ops.gguf_modules import STEP_DECODE, STEP_PREFILL, GgufEmbedding, GgufLinear
from npu_ops.quant_gguf import GgufWeight
from tests import packed_checks
from tests.unit.test_gguf_engine import POOL, PROMPTS, tiny_gguf  # noqa: F401 (a fixture)
from tests.unit.test_gguf_q8 import random_weight

pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")
KINDS = ("Q4_0", "Q4_1", "Q4_1F")
# rows: one group, an odd number of groups (the lanes' last 8-row group half empty), many; k: one block, long rows
SHAPES = ((4, 32), (36, 96), (260, 2048))


def repacked(w: GgufWeight) -> GgufWeight:
    out = GgufWeight(w.data.clone(), w.kind, w.shape)
    assert quant_gguf_x4.to_x4(out) and out.kind == quant_gguf_x4.X4_OF[w.kind]
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_a_block_step_holds_the_4_rows_scales_then_their_nibbles(kind):
    w = random_weight(kind, 8, 64, seed=1)
    sb, bb = quant_gguf_x4.SCALE_BYTES[kind], w.block_type.block_bytes
    x4 = repacked(w).data
    rb = w.data.shape[1]
    for g in range(2):
        flat = x4[4 * g:4 * g + 4].reshape(-1)  # the group's bytes, in the place its 4 rows held
        for b in range(2):
            step = flat[b * 4 * bb:(b + 1) * 4 * bb]
            for r in range(4):
                row = w.data[4 * g + r].reshape(-1)[b * bb:(b + 1) * bb]
                assert torch.equal(step[sb * r:sb * (r + 1)], row[:sb])
                assert torch.equal(step[4 * sb + 16 * r:4 * sb + 16 * (r + 1)], row[sb:])
    assert x4.shape == (8, rb)
    assert torch.equal(quant_gguf_x4.deinterleave(x4, sb), w.data)
    assert torch.equal(repacked(w).dequantize(), w.dequantize())


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_every_entry_point_gives_the_stored_layouts_bits(kind, threads):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for n, k in SHAPES:
            w = random_weight(kind, n, k, seed=n)
            w4 = repacked(w)
            for m in (1, 2, 3, 4, 5, 8, 16, 33):
                x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
                for int8 in (True, False):
                    want = gguf_cpu.matmul(x, w, int8_rows=int8)
                    assert torch.equal(gguf_cpu.matmul(x, w4, int8_rows=int8), want), (n, k, m, int8)
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("kind", KINDS)
def test_a_linear_gives_the_same_bits_in_prefill_tiles_and_decode_steps(kind):
    # a qkv-like table: a 4-bit part repacked next to a Q8_0 part as stored; prefill on the fp32 tiles (the tiles
    # un-interleave their panels' rows) or the int8 GEMM, decode on the int8 kernels, the team's x shared
    n, k = 152, 4096 + 32  # the tiles' two K-chunks, 16-row panels with a short last one
    w, v = random_weight(kind, n, k, seed=2), random_weight("Q8_0", 36, k, seed=3)
    w4 = repacked(w)  # held: a segment table holds its bytes' address only
    for steps in (0, 1 << STEP_DECODE, 3):
        stored, packed = gguf_cpu.segments([w, v], steps), gguf_cpu.segments([w4, v], steps)
        for m in (1, 3, 13):
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
            for step in (STEP_PREFILL, STEP_DECODE):
                want = gguf_cpu.linear(x, stored, k, n + 36, None, step)
                assert torch.equal(gguf_cpu.linear(x, packed, k, n + 36, None, step), want), (steps, m, step)


def test_what_cannot_be_repacked_or_read_by_rows_is_said():
    assert not quant_gguf_x4.to_x4(random_weight("Q4_0", 6, 32))  # not whole groups
    assert not quant_gguf_x4.to_x4(random_weight("Q8_0", 8, 32))  # no interleaved layout
    w4 = repacked(random_weight("Q4_0", 8, 64))
    with pytest.raises(ValueError, match="interleaved"):
        w4.rows(torch.tensor([1]))
    with pytest.raises(ValueError, match="interleaved"):
        gguf_cpu.dequantize_row(w4, 1)
    with pytest.raises(ValueError, match="groups of 4"):
        GgufWeight(w4.data[:6].clone(), w4.kind, (6, 64))
    assert not gguf_cpu.embeddable(w4.kind)


def test_the_arena_repacks_linears_and_never_embeddings():
    emb_w, lin_w = random_weight("Q4_0", 64, 32, seed=4), random_weight("Q4_1", 16, 32, seed=5)
    model = nn.Module()
    model.embed_tokens = GgufEmbedding(emb_w)
    model.lm_head = GgufLinear([emb_w])  # tied: the embeddings' own bytes
    model.proj = GgufLinear([lin_w])
    want = lin_w.dequantize()
    assert packed_arena.gather_packed(model) > 0
    assert emb_w.kind == "Q4_0" and model.lm_head.parts[0] is emb_w  # one copy, still read by rows
    assert model.proj.kinds == ["Q4_1x4"] and torch.equal(model.proj.parts[0].dequantize(), want)


def test_a_loaded_model_gives_the_unrepacked_tokens_and_logprobs(tiny_gguf, monkeypatch):  # noqa: F811
    llm = LLM(str(tiny_gguf), dtype="float32", gguf_activations="int8", **POOL)
    assert "Q4_1x4" in llm.engine.runner.model.layers[0].mlp.down_proj.kinds
    got = packed_checks.generate(llm, PROMPTS)
    monkeypatch.setattr(quant_gguf_x4, "to_x4", lambda w: False)
    stored = LLM(str(tiny_gguf), dtype="float32", gguf_activations="int8", **POOL)
    assert stored.engine.runner.model.layers[0].mlp.down_proj.kinds == ["Q4_1"]
    assert got == packed_checks.generate(stored, PROMPTS)

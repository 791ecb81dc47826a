"""The fused decoder layers (npu_ops/csrc/layers_f32.c) over an int8 KV cache (npu_ops/quant_kv.py's rows): the C
loop quantizes each step's K/V rows as quant_kv does and reads them in place (attention_int8.c for batch rows,
attention_lone_i8.c for a lone decode row shared by the team), bit-identical to the op-by-op path (quant_kv's
quantize, paged_attention_rows_i8); on odd heads (head_dim 10: the per-head tasks) and on SmolLM2's (9 heads over 3
KV heads of 64: the lone row's grouped V passes) over a context of many blocks."""
from __future__ import annotations

import pytest
import torch

from mindie_service.models.llama import LlamaDims
from npu_ops import cpu_kernels, quant, quant_kv
from tests.unit.test_fused_layers import _model, _run, fused_and_op_by_op

# a team of two threads, whatever the worker's: the fused decoder's splits and barriers are under test
pytestmark = [
    pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here"),
    pytest.mark.usefixtures("two_threads"),
]


def _smollm_heads(layers: int = 2) -> LlamaDims:
    return LlamaDims(hidden=48, heads=9, kv_heads=3, head_dim=64, intermediate=32, layers=layers, vocab=37, eps=1e-5,
                     qkv_bias=False, o_bias=False, mlp_bias=False, tie_embeddings=False)


# sequence 0 prefills 45 tokens (11+ blocks of 4) with sequences 1 (3) and 2 (6), then a step of three decode rows
# (tasks by KV head: a row widened once for its query heads), sequence 0 alone (the lone row over blocks shared
# unevenly by the team), two decode rows (with two threads, tasks of one query head each), and the lone row again
# (test_quant_kernels.py holds the task splits against each other). Rows after the first step name the sequences
# in the order 0, 2, 1.
LONG = [([0] * 45 + [1] * 3 + [2] * 6, list(range(45)) + list(range(3)) + list(range(6))),
        ([0, 1, 2], [45, 6, 3]), ([0], [46]), ([0, 1], [47, 7]), ([0], [48])]
LONG_BLOCKS = [[13, 2, 7, 0, 9, 4, 11, 1, 15, 6, 3, 14, 16], [5, 17], [8, 10]]


@pytest.mark.parametrize("inter,bias", [(21, True), (32, False)])
def test_odd_heads_on_an_int8_cache(inter, bias):
    model = _model(inter, bias, seed=inter + 3)
    fused, op_by_op = fused_and_op_by_op(model, kv_int8=True)
    for a, b in zip(fused, op_by_op):
        assert torch.equal(a, b)


@pytest.mark.parametrize("scheme", [None, "w8a8"])
def test_a_lone_row_over_many_blocks_of_an_int8_cache(scheme):
    model = _model(32, False, seed=11, d=_smollm_heads())
    d = model.dims
    if scheme:
        assert quant.quantize_model(model, scheme, keep_float=("lm_head",)) == 4 * d.layers
        assert quant.pack_quantized(model) == 4 * d.layers
    exact = _run(model, torch.zeros(d.layers, 2, 18, 4, d.kv_heads, d.head_dim), True, LONG, LONG_BLOCKS)
    fused, op_by_op = fused_and_op_by_op(model, True, LONG, LONG_BLOCKS)
    for a, b, want in zip(fused, op_by_op, exact):
        assert torch.equal(a, b)
        # int8 K/V move the outputs a little from the fp32 cache's, no more
        assert (a - want).abs().max() < 0.1 * want.abs().max()

"""All decoder layers of a step in one C call (npu_ops/csrc/layers_f32.c, mindie_service/models/fused_layers.py):
bit-identical to the op-by-op kernel path and within fp32 error of a plain PyTorch reference, on random odd
shapes, for a step mixing decode rows with prefill rows that read a cached prefix; and kept off where a
step needs the op-by-op path (LoRA)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mindie_service.models import fused_layers
from mindie_service.models.llama import LlamaDims, LlamaForCausalLM, StepContext
from npu_ops import cpu_kernels, ops, quant_kv

# a team of two threads, whatever the worker's: the fused decoder's splits and barriers are under test
pytestmark = [
    pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here"),
    pytest.mark.usefixtures("two_threads"),
]

BS = 4  # KV block size


def _model(inter: int, bias: bool, seed: int, d: LlamaDims | None = None) -> LlamaForCausalLM:
    """Random weights, packed for the C kernels; default dims odd (hidden 40, 6 heads over 2 KV heads of 10)."""
    d = d or LlamaDims(hidden=40, heads=6, kv_heads=2, head_dim=10, intermediate=inter, layers=3, vocab=37,
                       eps=1e-5, qkv_bias=bias, o_bias=bias, mlp_bias=bias, tie_embeddings=False)
    g = torch.Generator().manual_seed(seed)
    inv = 1.0 / 10000 ** (torch.arange(0, d.head_dim, 2).float() / d.head_dim)
    ang = torch.outer(torch.arange(64).float(), inv)
    ang = torch.cat([ang, ang], -1)
    model = LlamaForCausalLM(d, ang.cos(), ang.sin())
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if p.dim() == 1 and p.shape[0] == d.hidden else 0.0))
    for m in model.modules():
        if hasattr(m, "pack"):
            assert m.pack(8, keep_dense=True)
    return model


def _steps() -> list[tuple[list[int], list[int]]]:
    """(row_seq, row_pos) of three steps: 3 prompts (5, 9, 2 tokens) prefilled, then a step with two decode
    rows (sequences 0, 2) and sequence 1 prefilling 6 more tokens after its 9, then sequence 0 decoding alone
    (one row: the path where every thread norms and quantizes the row itself)."""
    first = ([0] * 5 + [1] * 9 + [2] * 2, list(range(5)) + list(range(9)) + list(range(2)))
    second = ([0, 1] + [2] * 6, [5, 2] + list(range(9, 15)))  # block-table rows: seq 0, seq 2, seq 1
    return [first, second, ([0], [6])]


TABLES = [[3, 7], [0, 5, 9, 2], [4]]  # blocks of sequences 0, 1, 2 (16 blocks in the pool)


Steps = list[tuple[list[int], list[int]]]


def _run(model: LlamaForCausalLM, pool: torch.Tensor, fused: bool, steps: Steps | None = None,
         blocks: list[list[int]] = TABLES) -> list[torch.Tensor]:
    """The steps' outputs (default _steps() over TABLES, whose rows the steps after the first take in the order
    0, 2, 1)."""
    fused_layers.set_enabled(fused)
    kv = [(pool[i, 0], pool[i, 1]) for i in range(model.dims.layers)]
    g = torch.Generator().manual_seed(5)
    outs = []
    mb = max(map(len, blocks))
    try:
        for step, (seqs, pos) in enumerate(steps or _steps()):
            order = [0, 1, 2] if step == 0 else [0, 2, 1]
            tables = torch.tensor([blocks[s] + [0] * (mb - len(blocks[s])) for s in order], dtype=torch.int32)
            slots = torch.tensor([blocks[order[s]][p // BS] * BS + p % BS for s, p in zip(seqs, pos)])
            meta = ops.AttentionMetadata(slots=slots, block_tables=tables, row_seq=torch.tensor(seqs, dtype=torch.int32),
                                         row_pos=torch.tensor(pos, dtype=torch.int32))
            ids = torch.randint(0, model.dims.vocab, (len(seqs),), generator=g)
            with torch.inference_mode():
                outs.append(model(ids, StepContext(positions=torch.tensor(pos), attn=meta), kv).clone())
    finally:
        fused_layers.set_enabled(True)
    return outs


@torch.no_grad()
def _reference(model: LlamaForCausalLM) -> list[torch.Tensor]:
    """Plain PyTorch on the dense weights: each row attends to its sequence's positions 0..pos."""
    d, g = model.dims, torch.Generator().manual_seed(5)
    cache = {}  # (layer, seq, pos) -> (k, v)
    outs = []
    for step, (seqs, pos) in enumerate(_steps()):
        seq_ids = [s if step == 0 else [0, 2, 1][s] for s in seqs]
        x = model.embed_tokens(torch.randint(0, d.vocab, (len(seqs),), generator=g))
        cos, sin = model.rope_cos[torch.tensor(pos)], model.rope_sin[torch.tensor(pos)]
        for li, layer in enumerate(model.layers):
            at, mlp = layer.self_attn, layer.mlp
            qkv = F.linear(ops.rms_norm_ref(x, layer.input_layernorm.weight, d.eps), at.qkv_proj.weight, at.qkv_proj.bias)
            q = ops.rotary_ref(qkv[:, :at.q_size].view(-1, d.heads, d.head_dim), cos, sin)
            k = ops.rotary_ref(qkv[:, at.q_size:at.q_size + at.kv_size].view(-1, d.kv_heads, d.head_dim), cos, sin)
            v = qkv[:, at.q_size + at.kv_size:].view(-1, d.kv_heads, d.head_dim)
            for r, (s, p) in enumerate(zip(seq_ids, pos)):
                cache[li, s, p] = (k[r], v[r])
            att = torch.empty(len(seqs), d.heads, d.head_dim)
            for r, (s, p) in enumerate(zip(seq_ids, pos)):
                ks = torch.stack([cache[li, s, j][0] for j in range(p + 1)]).repeat_interleave(d.heads // d.kv_heads, 1)
                vs = torch.stack([cache[li, s, j][1] for j in range(p + 1)]).repeat_interleave(d.heads // d.kv_heads, 1)
                w = torch.softmax(torch.einsum("hd,jhd->hj", q[r], ks) * at.scale, -1)
                att[r] = torch.einsum("hj,jhd->hd", w, vs)
            x = x + F.linear(att.view(len(seqs), -1), at.o_proj.weight, at.o_proj.bias)
            gu = F.linear(ops.rms_norm_ref(x, layer.post_attention_layernorm.weight, d.eps), mlp.gate_up_proj.weight,
                          mlp.gate_up_proj.bias)
            x = x + F.linear(ops.silu_mul_ref(gu), mlp.down_proj.weight, mlp.down_proj.bias)
        outs.append(ops.rms_norm_ref(x, model.norm.weight, d.eps))
    return outs


@pytest.mark.parametrize("inter,bias", [(32, False), (32, True), (21, True), (24, False)])
def test_fused_layers_equal_the_op_by_op_path_and_the_reference(inter, bias):
    """inter 32: silu(gate) * up in gate/up's epilogue; 21 and 24 (not whole 16-column panels): a separate pass."""
    model = _model(inter, bias, seed=inter)
    fused, op_by_op = fused_and_op_by_op(model)
    for a, b, want in zip(fused, op_by_op, _reference(model)):
        assert torch.equal(a, b)
        torch.testing.assert_close(a, want, rtol=1e-4, atol=1e-4)


def fused_and_op_by_op(model: LlamaForCausalLM, kv_int8: bool = False, steps: Steps | None = None,
                       blocks: list[list[int]] = TABLES) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Both steps' outputs through the fused call (asserted taken, once per step) and through the op-by-op
    path, each into its own KV pool (fp32, or npu_ops/quant_kv.py's int8 rows); the two pools must end equal
    (the same K/V in the same slots)."""
    d = model.dims
    nblocks = max(max(b) for b in blocks) + 1
    pools = [torch.zeros(d.layers, 2, nblocks, BS, d.kv_heads, quant_kv.row_bytes(d.head_dim), dtype=torch.int8)
             if kv_int8 else torch.zeros(d.layers, 2, nblocks, BS, d.kv_heads, d.head_dim) for _ in range(2)]
    calls = []
    lib = cpu_kernels.load()
    real = lib.llama_layers_f32
    try:
        lib.llama_layers_f32 = lambda *a: calls.append(1) or real(*a)
        fused = _run(model, pools[0], True, steps, blocks)
    finally:
        lib.llama_layers_f32 = real
    assert len(calls) == len(steps or _steps())  # every step took the fused path
    op_by_op = _run(model, pools[1], False, steps, blocks)
    assert torch.equal(pools[0], pools[1])
    return fused, op_by_op


def test_a_step_with_lora_stays_on_the_op_by_op_path():
    model = _model(32, False, seed=1)
    pool = torch.zeros(model.dims.layers, 2, 16, BS, model.dims.kv_heads, model.dims.head_dim)
    kv = [(pool[i, 0], pool[i, 1]) for i in range(model.dims.layers)]
    meta = ops.AttentionMetadata(slots=torch.tensor([12]), block_tables=torch.tensor([[3]], dtype=torch.int32),
                                 row_seq=torch.tensor([0], dtype=torch.int32), row_pos=torch.tensor([0], dtype=torch.int32))
    x = model.embed_tokens(torch.tensor([1])).detach()
    cos, sin = model.rope_cos[:1], model.rope_sin[:1]
    ctx = StepContext(positions=torch.tensor([0]), attn=meta, lora=object())  # type: ignore[arg-type]
    assert not fused_layers.run(model, x.clone(), cos, sin, ctx, kv)
    ctx.lora = None
    assert fused_layers.run(model, x.clone(), cos, sin, ctx, kv)

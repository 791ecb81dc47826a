"""Prompt pieces over GGUF blocks through fp32 tiles (csrc/gemm_gguf_tile.c, chosen in csrc/gguf_linear.c): for every
block type with a row kernel, a prefill piece on fp32 activations gives, bit for bit, our packed fp32 sgemm
(csrc/gemm.c) over the weights dequantized (each output one FMA chain over k), so within an fp32 GEMM's error bound
of ``x @ dequantize(W).T``; over several NC row tiles and K-chunks (a short last one), any row count, any thread
split, and a row alone gives its bits in a batch (a prompt's numerics do not depend on how much of it was cached).
Decode steps and int8-all's prefill keep their own kernels. A teacher-forced prefill over a GGUF's blocks gives the
log-probs of the same file dequantized at load bit for bit, and an engine gives a prompt the same tokens and
log-probs when its prefix was cached (a 1-row prefill piece) as when it ran whole."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mindie_service import LLM
from mindie_service.devkit.quant_eval import teacher_forced_logprobs
from npu_ops import cpu_kernels, gguf_cpu
from npu_ops.gguf_modules import INT8_ALL, STEP_DECODE, STEP_PREFILL, GgufLinear, gguf_step
from npu_ops.linear import within_fp32_gemm_error
from npu_ops import quant_gguf_x4
from npu_ops.quant_gguf import BLOCK_TYPES, GgufWeight, block_type, matmul_ref
from tests.gguf_files import write_gguf
from tests.packed_checks import generate

pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")

# where each type keeps its scales (and mins): byte offset, dtype; the rest of a block is random quant bytes
SCALES = {"Q4_0": [(0, np.float16)], "Q4_1": [(0, np.float16), (2, np.float16)], "Q8_0": [(0, np.float16)],
          "Q5_0": [(0, np.float16)], "Q5_1": [(0, np.float16), (2, np.float16)],
          "Q4_1F": [(0, np.float32), (4, np.float32)], "Q4_K": [(0, np.float16), (2, np.float16)],
          "Q5_K": [(0, np.float16), (2, np.float16)], "Q6_K": [(208, np.float16)]}
block_type("Q4_K")  # the plugins' types registered too
TILED = sorted(name for name, bt in list(BLOCK_TYPES.items()) if bt.row_kernel and gguf_cpu.runnable(name) is None)


def random_weight(kind: str, n: int, k: int, seed: int) -> GgufWeight:
    """Random quant bytes, random scales of both signs over four decades (mins small)."""
    bt = BLOCK_TYPES[kind]
    if bt.base is not None:  # a repacked type (npu_ops.quant_gguf_x4): its base's random blocks, repacked
        w = random_weight(bt.base, n, k, seed)
        assert quant_gguf_x4.to_x4(w) and w.kind == kind
        return w
    assert kind in SCALES, f"{kind}: say where its scales lie (SCALES) so its random blocks stay finite"
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n, k // bt.block_size, bt.block_bytes), dtype=np.uint8)
    for i, (at, dt) in enumerate(SCALES[kind]):
        v = rng.choice([-1, 1], size=raw.shape[:2]) * 10.0 ** rng.uniform(-4 if i == 0 else -5, -1, size=raw.shape[:2])
        raw[..., at:at + np.dtype(dt).itemsize] = v.astype(dt)[..., None].view(np.uint8)
    return GgufWeight(torch.from_numpy(raw.reshape(n, -1).copy()), kind, (n, k))


@pytest.fixture(scope="module")
def tiny_gguf(tiny_model, tmp_path_factory) -> Path:
    """The demo tiny model as a GGUF: projections in Q4_1, the head in Q4_0, the embeddings in Q8_0."""
    gguf = pytest.importorskip("gguf")
    T = gguf.GGMLQuantizationType
    types = {f"blk.{b}.{n}.weight": T.Q4_1 for b in range(4) for n in ("attn_q", "attn_k", "attn_v", "attn_output",
                                                                       "ffn_gate", "ffn_up", "ffn_down")}
    types.update({"token_embd.weight": T.Q8_0, "output.weight": T.Q4_0})
    return write_gguf(Path(tiny_model), tmp_path_factory.mktemp("gguf") / "tiny-q4_1.gguf", types)


def shape_of(kind: str) -> tuple[int, int]:
    """150 rows (16-row tiles, the last 6 rows), two K-chunks of KC = 4096 columns (the second short: a block, or
    a super-block), each decoded 256 columns at a time"""
    return 150 + -150 % BLOCK_TYPES[kind].interleave, 4096 + BLOCK_TYPES[kind].block_size


def prefill(layer: GgufLinear, x: torch.Tensor) -> torch.Tensor:
    with gguf_step(STEP_PREFILL):
        return layer(x)


@pytest.mark.parametrize("kind", TILED)
def test_a_prefill_piece_gives_the_fp32_sgemm_over_the_dequantized_weights(kind):
    n, k = shape_of(kind)
    w = random_weight(kind, n, k, seed=len(kind))
    layer, dense = GgufLinear([w]), w.dequantize()
    sgemm = cpu_kernels.pack_weight(dense)
    threads = torch.get_num_threads()
    try:
        for m, t in ((1, 1), (5, 2), (13, 1)):
            torch.set_num_threads(t)
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
            got = prefill(layer, x)
            assert torch.equal(got, cpu_kernels.linear(x, sgemm, n, None)), (kind, m)
            assert within_fp32_gemm_error(got, matmul_ref(x, w), x, dense)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("kind", ["Q4_0", "Q6_K"])
def test_a_rows_tile_result_is_its_own_at_any_row_count_and_thread_split(kind):
    n, k = shape_of(kind)
    parts = [random_weight(kind, 40, k, seed=1), random_weight("Q8_0", 21, k, seed=2), random_weight(kind, n, k, 3)]
    bias = torch.randn(40 + 21 + n)
    layer = GgufLinear(parts, bias)
    x = torch.randn(20, k, generator=torch.Generator().manual_seed(5))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        full = prefill(layer, x)
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            assert torch.equal(prefill(layer, x), full)
            for i, j in ((0, 1), (7, 8), (3, 10), (19, 20)):
                assert torch.equal(prefill(layer, x[i:j]), full[i:j])
    finally:
        torch.set_num_threads(threads)
    dense = layer.dequantized()
    assert within_fp32_gemm_error(full, x @ dense.T + bias, x, dense, bias)


def test_decode_steps_and_int8_all_prefill_keep_their_kernels():
    w = random_weight("Q4_1", 48, 256, seed=4)
    layer, x = GgufLinear([w]), torch.randn(9, 256, generator=torch.Generator().manual_seed(6))
    tiles, packed = prefill(layer, x), gguf_cpu.matmul(x, w)
    assert not torch.equal(tiles, packed)  # two summation orders: the comparisons below can tell them apart
    with gguf_step(STEP_DECODE):
        assert torch.equal(layer(x), packed)
    layer.prefill_tiles = False
    assert torch.equal(prefill(layer, x), packed)
    layer.prefill_tiles, layer.int8_steps = True, INT8_ALL
    assert torch.equal(prefill(layer, x), gguf_cpu.matmul(x, w, int8_rows=True))


def test_a_packed_prefill_is_the_dequantized_reference_bit_for_bit(tiny_gguf):
    """Every projection and the head: teacher-forced log-probs over the file's blocks equal those of the file
    dequantized at load (our fp32 sgemm over the same values)."""
    tokens = list(range(3, 51))
    ref = teacher_forced_logprobs(tiny_gguf, tokens, seq_len=48, chunk=16, gguf_packed=False)
    assert torch.equal(teacher_forced_logprobs(tiny_gguf, tokens, seq_len=48, chunk=16), ref)


@pytest.mark.parametrize("activations", ["int8", "fp32"])
def test_a_prompt_whose_prefix_was_cached_gets_its_first_runs_bits(tiny_gguf, activations):
    llm = LLM(str(tiny_gguf), dtype="float32", gguf_activations=activations, cache_block_size=4, num_kv_blocks=64,
              max_seq_len=128)
    prompt = list(range(3, 40))  # 37 tokens: 36 of them cached for the second run, which prefills one row
    first = generate(llm, [prompt])
    blocks = llm.engine.blocks
    hits = blocks.prefix_hits
    assert generate(llm, [prompt]) == first
    assert blocks.prefix_hits == hits + 1  # the second run found its prefix cached (36 of its 37 tokens)

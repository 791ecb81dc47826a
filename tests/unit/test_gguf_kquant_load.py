"""K-quant GGUF files load packed (npu_ops/quant_gguf_kquant.py registers Q4_K, Q5_K and Q6_K in quant_gguf's table):
a small random Llama written as a Q4_K_M file (Q4_K linears; attn_v, ffn_down and the tied embeddings in Q6_K, as
llama.cpp's mix does) and as a Q5_K_M one (Q5_K + Q6_K) keeps every linear, the embeddings and the head packed, and
its teacher-forced log-probs match the same file dequantized at load (our fp32 path over the reference dequantizers,
which equal gguf.quants.dequantize bit for bit) within fp32 accumulation order: max |log-prob difference| < 1e-4,
top-1 agreement 1.0. The fused one-call decode step reads a Q6_K embedding row with the row kernel."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mindie_service.models.loader import load_model
from npu_ops import cpu_kernels, gguf_cpu
from tests import packed_checks
from tests.gguf_files import finish, llama_shapes, llama_writer
from tests.unit.test_gguf_kquant import kquantize

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")

HIDDEN, FFN, VOCAB, LAYERS = 256, 512, 96, 2  # K-quant rows are whole 256-value super-blocks
T = gguf.GGMLQuantizationType
MIXES = {"Q4_K_M": ("Q4_K", "Q6_K"), "Q5_K_M": ("Q5_K", "Q6_K")}
TOKENS = [int(t) for t in np.random.default_rng(1).integers(0, VOCAB, size=48)]


def write_mix(path: Path, mix: str) -> Path:
    """A random 2-layer Llama (2 heads of 128, 1 KV head, tied head) in llama.cpp's ``mix``."""
    base, high = MIXES[mix]
    w = llama_writer(path, "kq", HIDDEN, FFN, VOCAB, LAYERS)
    rng = np.random.default_rng(0)
    for name, shape in llama_shapes(HIDDEN, FFN, VOCAB, LAYERS).items():
        if len(shape) == 1:
            w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
            continue
        data = (rng.standard_normal(shape) * 2.0 / shape[1] ** 0.5).astype(np.float32)
        kind = high if name.split(".")[-2] in ("attn_v", "ffn_down", "token_embd") else base
        w.add_tensor(name, kquantize(data, kind), raw_dtype=T[kind])
    finish(w)
    return path


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_a_k_quant_mix_loads_packed_and_matches_the_dequantized_reference(tmp_path: Path, mix: str) -> None:
    base, high = MIXES[mix]
    f = write_mix(tmp_path / f"{mix}.gguf", mix)
    loaded = load_model(f, "float32", torch.device("cpu"), 128)
    m = loaded.model
    packed_checks.all_packed(m)
    assert loaded.weights_report[base] == f"{5 * LAYERS} tensors: kept packed"
    assert loaded.weights_report[high] == f"{1 + 2 * LAYERS} tensors: kept packed"
    assert gguf_cpu.embeddable(high)  # the one-call decode step reads its rows
    packed_checks.matches_the_dequantized_load(f, TOKENS, 48, mix)

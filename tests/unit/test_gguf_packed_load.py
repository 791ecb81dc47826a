"""A GGUF's quantized weights kept as stored (models/gguf_packed.py): small random Llamas written with the gguf
package's writer and ``gguf.quants.quantize`` load with every linear, the embeddings and the tied head packed (the
head reads the embeddings' bytes: no second copy), and their teacher-forced log-probs match the same file
dequantized at load (our fp32 path over gguf.quants.dequantize) within fp32 accumulation order: max |log-prob
difference| < 1e-4 and the same argmax wherever the reference's top two differ by more than 1e-3, for every block
type we run. A type without kernels, or a projection one of whose parts cannot stay packed, is dequantized with a
WARNING naming the file, the tensor and its type, and ``weights_report`` says what happened to each tensor; a type
the reader does not know is a load error naming the file, the tensor and the type."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from mindie_service.devkit.quant_eval import teacher_forced_logprobs
from mindie_service.errors import ValidationError
from mindie_service.models.loader import load_model
from npu_ops import cpu_kernels
from npu_ops.gguf_modules import GgufEmbedding, GgufLinear
from tests import packed_checks
from tests.gguf_files import add_tensor, finish, llama_shapes, llama_writer

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")

HIDDEN, FFN, VOCAB, LAYERS = 64, 128, 96, 2
T = gguf.GGMLQuantizationType
LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def write_model(path: Path, qtype: object, overrides: dict[str, object] | None = None) -> Path:
    """A random 2-layer Llama, tied head, every linear and the embeddings in ``qtype`` (``overrides`` per name)."""
    w = llama_writer(path, "tiny", HIDDEN, FFN, VOCAB, LAYERS)
    rng = np.random.default_rng(0)
    shapes = llama_shapes(HIDDEN, FFN, VOCAB, LAYERS)
    types = {n: qtype for n, s in shapes.items() if len(s) == 2}
    types.update(overrides or {})
    for name, shape in shapes.items():
        scale = 1.0 if len(shape) == 1 else 2.0 / shape[1] ** 0.5
        data = (rng.standard_normal(shape) * scale + (1.0 if len(shape) == 1 else 0.0)).astype(np.float32)
        if types.get(name) == T.IQ4_NL:
            w.add_tensor(name, iq4_nl(data), raw_dtype=T.IQ4_NL)
            continue
        add_tensor(w, name, data, {k: v for k, v in types.items() if v is not None})
    finish(w)
    return path


def iq4_nl(data: np.ndarray) -> np.ndarray:
    """IQ4_NL blocks (a type we have no kernel for; gguf cannot quantize to it): Q4_0's bytes, laid out alike (fp16 d,
    16 bytes of nibbles), their scales over 16 as IQ4_NL's table (-127 .. 113) spans 16 times Q4_0's steps."""
    raw = np.ascontiguousarray(gguf.quants.quantize(data, T.Q4_0)).reshape(-1, 18)
    raw[:, 0:2] = (raw[:, 0:2].copy().view(np.float16) / 16).view(np.uint8)
    return raw.reshape(data.shape[0], -1)


TOKENS = [int(t) for t in np.random.default_rng(1).integers(0, VOCAB, size=64)]


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_packed_load_matches_the_dequantized_reference(tmp_path, qtype):
    f = write_model(tmp_path / f"{qtype}.gguf", T[qtype])
    loaded = load_model(f, "float32", torch.device("cpu"), 128)
    m = loaded.model
    packed_checks.all_packed(m)
    assert loaded.weights_report[qtype] == f"{1 + 7 * LAYERS} tensors: kept packed"
    assert loaded.weights_report["blk.1.ffn_down.weight"] == f"{qtype}: kept packed"
    packed_checks.matches_the_dequantized_load(f, TOKENS, 64, qtype)


def test_a_type_without_kernels_is_dequantized_with_a_warning(tmp_path, caplog):
    f = write_model(tmp_path / "iq4.gguf", T.Q4_0, {"blk.0.ffn_down.weight": T.IQ4_NL, "blk.1.attn_v.weight": T.F16})
    with caplog.at_level(logging.WARNING):
        loaded = load_model(f, "float32", torch.device("cpu"), 128)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("iq4.gguf" in w and "blk.0.ffn_down.weight" in w and "IQ4_NL" in w for w in warned), warned
    # v in F16 holds layer 1's q and k back: one projection is packed or dense as a whole
    assert any("blk.1.attn_q.weight" in w and "blk.1.attn_v.weight is F16" in w for w in warned), warned
    r, m = loaded.weights_report, loaded.model
    assert r["blk.0.ffn_down.weight"] == "IQ4_NL: dequantized at load (no CPU kernel for IQ4_NL)"
    assert r["blk.0.ffn_up.weight"] == "Q4_0: kept packed"
    assert r["Q4_0"] == f"{1 + 7 * LAYERS - 2} tensors: 11 kept packed, the others dequantized from Q4_0 at load"
    assert not isinstance(m.layers[0].mlp.down_proj, GgufLinear) and isinstance(m.layers[0].mlp.gate_up_proj, GgufLinear)
    assert not isinstance(m.layers[1].self_attn.qkv_proj, GgufLinear)
    ref = teacher_forced_logprobs(f, TOKENS, seq_len=64, chunk=16, gguf_packed=False)
    got = teacher_forced_logprobs(f, TOKENS, seq_len=64, chunk=16)
    assert (got - ref).abs().max() < 1e-4


def test_a_gguf_is_dequantized_where_packing_does_not_apply(tmp_path):
    f = write_model(tmp_path / "q8.gguf", T.Q8_0)
    loaded = load_model(f, "float32", torch.device("cpu"), 128, quantization="w8a16")
    assert "requantized to int8" in loaded.weights_report["Q8_0"]
    assert not any(isinstance(mod, (GgufLinear, GgufEmbedding)) for mod in loaded.model.modules())


def test_a_tensor_of_a_type_we_cannot_read_is_a_load_error_naming_it(tmp_path):
    f = write_model(tmp_path / "odd.gguf", T.Q4_0)
    raw = bytearray(f.read_bytes())
    name = b"blk.1.ffn_up.weight"
    at = raw.index(name) + len(name) + 4 + 2 * 8  # the name, n_dims (u32), two dims (u64): then the type (u32)
    assert int.from_bytes(raw[at:at + 4], "little") == T.Q4_0
    raw[at:at + 4] = (250).to_bytes(4, "little")
    f.write_bytes(bytes(raw))
    with pytest.raises(ValidationError) as exc:
        load_model(f, "float32", torch.device("cpu"), 128)
    msg = str(exc.value)
    assert str(f) in msg and "blk.1.ffn_up.weight" in msg and "250" in msg, msg

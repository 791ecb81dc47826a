"""GGUF loading on small synthetic files (gguf.GGUFWriter): a file we cannot run is a clear load error
naming the file and what is wrong (malformed, truncated, a tensor of an unknown type, an architecture we do
not run); a tied head is one tensor; the quantize command takes a .gguf."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from mindie_service.errors import ValidationError
from mindie_service.models.gguf_checkpoint import find_gguf, open_checkpoint, unpermute_qk
from mindie_service.models.loader import load_model
from tests.gguf_files import add_tensor, finish

gguf = pytest.importorskip("gguf")

HIDDEN, VOCAB, FFN = 8, 16, 16


def write_tiny(path: Path, arch: str = "llama", hidden: int = HIDDEN, ffn: int = FFN,
               types: dict[str, Any] | None = None, name: str = "tiny") -> Path:
    """A one-layer model of ``arch`` with every tensor a Llama needs, tied embeddings; F32 unless ``types``
    (tensor name -> gguf.GGMLQuantizationType) says otherwise."""
    HIDDEN, FFN = hidden, ffn  # noqa: N806 (the shapes below read as the module's)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(VOCAB)
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (VOCAB, HIDDEN), "output_norm.weight": (HIDDEN,),
              "blk.0.attn_norm.weight": (HIDDEN,), "blk.0.ffn_norm.weight": (HIDDEN,),
              "blk.0.attn_q.weight": (HIDDEN, HIDDEN), "blk.0.attn_k.weight": (HIDDEN, HIDDEN),
              "blk.0.attn_v.weight": (HIDDEN, HIDDEN), "blk.0.attn_output.weight": (HIDDEN, HIDDEN),
              "blk.0.ffn_gate.weight": (FFN, HIDDEN), "blk.0.ffn_up.weight": (FFN, HIDDEN),
              "blk.0.ffn_down.weight": (HIDDEN, FFN)}
    if arch == "qwen2":  # Qwen2 has q/k/v biases
        shapes.update({"blk.0.attn_q.bias": (HIDDEN,), "blk.0.attn_k.bias": (HIDDEN,), "blk.0.attn_v.bias": (HIDDEN,)})
    for name, shape in shapes.items():
        add_tensor(w, name, rng.standard_normal(shape).astype(np.float32), types)
    finish(w)
    return path


def _load(path: Path) -> None:
    load_model(path, "float32", torch.device("cpu"), 64)


def _error(path: Path) -> str:
    with pytest.raises(ValidationError) as exc:
        _load(path)
    msg = str(exc.value)
    assert str(path) in msg, msg
    return msg.replace(str(path), "FILE")  # what is said about it (the test's folder name says much the same)


def test_a_well_formed_tiny_gguf_loads_with_its_head_tied(tmp_path, monkeypatch):
    monkeypatch.setattr("mindie_service.models.loader.pack_linears", lambda model, hint: 0)  # keep dense weights
    loaded = load_model(write_tiny(tmp_path / "ok.gguf"), "float32", torch.device("cpu"), 64)
    assert loaded.architecture == "LlamaForCausalLM"
    assert loaded.weights_report == {"F32": "11 tensors: kept"}
    m = loaded.model
    assert m.lm_head.weight is m.embed_tokens.weight  # tied: one tensor, not a copy
    per_layer = 2 * HIDDEN + 4 * HIDDEN * HIDDEN + 3 * HIDDEN * FFN
    assert sum(p.numel() for p in m.parameters()) == VOCAB * HIDDEN + HIDDEN + per_layer


def test_quantized_and_half_tensors_load_as_their_dequantized_values(tmp_path, monkeypatch):
    monkeypatch.setattr("mindie_service.models.loader.pack_linears", lambda model, hint: 0)
    T = gguf.GGMLQuantizationType
    types = {"token_embd.weight": T.Q8_0, "blk.0.attn_v.weight": T.F16, "blk.0.ffn_up.weight": T.BF16,
             "blk.0.ffn_down.weight": T.Q4_0, "blk.0.ffn_gate.weight": T.Q5_1, "blk.0.attn_output.weight": T.Q4_1}
    f = write_tiny(tmp_path / "q.gguf", hidden=64, ffn=64, types=types)
    loaded = load_model(f, "float32", torch.device("cpu"), 64, gguf_packed_weights=False)  # the dequantized path
    assert loaded.weights_report == {
        "BF16": "1 tensors: converted from BF16", "F16": "1 tensors: converted from F16",
        "F32": "5 tensors: kept", "Q4_0": "1 tensors: dequantized from Q4_0 at load",
        "Q4_1": "1 tensors: dequantized from Q4_1 at load", "Q5_1": "1 tensors: dequantized from Q5_1 at load",
        "Q8_0": "1 tensors: dequantized from Q8_0 at load"}
    reader = gguf.GGUFReader(str(f))
    want = {t.name: torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
            for t in reader.tensors}
    m = loaded.model
    assert torch.equal(m.embed_tokens.weight, want["token_embd.weight"])
    assert torch.equal(m.layers[0].mlp.down_proj.weight, want["blk.0.ffn_down.weight"])
    assert torch.equal(m.layers[0].self_attn.o_proj.weight, want["blk.0.attn_output.weight"])
    assert torch.equal(m.layers[0].self_attn.qkv_proj.weight[-64:], want["blk.0.attn_v.weight"])
    assert torch.equal(m.layers[0].mlp.gate_up_proj.weight[:64], want["blk.0.ffn_gate.weight"])
    assert torch.equal(m.layers[0].mlp.gate_up_proj.weight[64:], want["blk.0.ffn_up.weight"])


def test_with_quantization_set_the_report_says_requantized(tmp_path):
    f = write_tiny(tmp_path / "q8.gguf", hidden=64, ffn=64,
                   types={"blk.0.ffn_down.weight": gguf.GGMLQuantizationType.Q8_0})
    report = load_model(f, "float32", torch.device("cpu"), 64, quantization="w8a16").weights_report
    assert "requantized to int8 per output channel for w8a16" in report["Q8_0"]
    assert "per-32-value blocks" in report["Q8_0"]


@pytest.mark.parametrize("arch,name,want_arch", [("llama", "tiny", "LlamaForCausalLM"),
                                                 ("llama", "tiny-mistral", "MistralForCausalLM"),
                                                 ("qwen2", "tiny", "Qwen2ForCausalLM")])
def test_tiny_gguf_logprobs_match_transformers_on_the_same_file(tmp_path, arch, name, want_arch):
    """Each architecture's names, q/k row order (llama.cpp permutes Llama's, not Qwen2's) and biases: our
    teacher-forced log-probs equal transformers' on the same synthetic file."""
    from transformers import AutoModelForCausalLM
    from mindie_service.devkit.quant_eval import teacher_forced_logprobs
    f = write_tiny(tmp_path / f"{arch}.gguf", arch=arch, hidden=32, ffn=64, name=name)
    assert open_checkpoint(f).architecture == want_arch  # llama.cpp writes Mistral as "llama"
    tokens = [1, 5, 9, 2, 14, 3, 7, 7, 0, 11, 4, 15, 6, 8, 10, 12]
    ours = teacher_forced_logprobs(f, tokens, seq_len=16, chunk=8)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=f.name, dtype=torch.float32).eval()
    with torch.inference_mode():
        want = torch.log_softmax(hf(torch.tensor([tokens])).logits[0, :-1].float(), -1)
    assert (ours - want).abs().max().item() < 1e-4


def test_a_folder_holding_one_gguf_is_that_file(tmp_path):
    f = write_tiny(tmp_path / "m.gguf")
    assert find_gguf(tmp_path) == f and find_gguf(f) == f
    write_tiny(tmp_path / "other.gguf")
    with pytest.raises(ValidationError, match="holds 2"):
        find_gguf(tmp_path)


def test_malformed_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"this is not a gguf file at all" * 10)
    assert "malformed" in _error(bad)


def test_truncated_file_is_a_clear_error(tmp_path):
    f = write_tiny(tmp_path / "cut.gguf")
    data = f.read_bytes()
    f.write_bytes(data[:len(data) - 100])
    assert "truncated" in _error(f)


def test_unknown_tensor_type_is_a_clear_error(tmp_path):
    f = write_tiny(tmp_path / "odd.gguf")
    field = gguf.GGUFReader(str(f)).tensors[0].field  # parts: name len, name, n_dims, dims, type, offset
    type_at = field.offset + sum(p.nbytes for p in field.parts[:-2])
    raw = bytearray(f.read_bytes())
    raw[type_at:type_at + 4] = (250).to_bytes(4, "little")
    f.write_bytes(bytes(raw))
    assert "unknown type" in _error(f)


def test_unsupported_architecture_is_refused_by_name(tmp_path):
    msg = _error(write_tiny(tmp_path / "gpt2.gguf", arch="gpt2"))
    assert "'gpt2'" in msg and "llama" in msg and "qwen2" in msg


def test_quantize_command_takes_a_gguf(tmp_path):
    from mindie_service.models.msmodelslim import write_quantized
    out = write_quantized(write_tiny(tmp_path / "tiny.gguf"), tmp_path / "w8a16", "w8a16")
    assert (out / "quant_model_description_w8a16.json").is_file()
    loaded = load_model(out, "float32", torch.device("cpu"), 64)
    assert type(loaded.model.layers[0].mlp.down_proj).__name__ == "QuantLinear"


def test_unpermute_inverts_llama_cpp_permute():
    w = torch.randn(12, 5)
    n_head = 3
    # convert_hf_to_gguf.py LlamaModel.permute
    permuted = w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    assert torch.equal(unpermute_qk(permuted, n_head), w)

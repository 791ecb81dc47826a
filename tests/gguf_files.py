"""Write a small Hugging Face Llama folder (config.json, model.safetensors, a byte-level BPE tokenizer.json)
as a GGUF file, the way llama.cpp's converter lays it out (q/k rows permuted, ggml names, the tokenizer as
``tokenizer.ggml.*`` of type gpt2): catalog tests serve the demo ``tiny`` model from a ``.gguf``."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_BLOCK = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
          "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(hf: str) -> str:
    stem, _, kind = hf.rpartition(".")
    if stem in _GLOBAL:
        return f"{_GLOBAL[stem]}.{kind}"
    _, _, rest = stem.partition("model.layers.")
    layer, _, sub = rest.partition(".")
    return f"blk.{layer}.{_BLOCK[sub]}.{kind}"


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute of q/k rows (what models/gguf_checkpoint.unpermute_qk undoes)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tokenizer(w: Any, folder: Path) -> None:
    tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    cfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = dict(tok["model"]["vocab"])
    special = {a["content"]: a["id"] for a in tok.get("added_tokens", [])}
    vocab.update(special)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert len(tokens) == max(vocab.values()) + 1, "the vocabulary has holes"
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])  # 3: CONTROL
    w.add_token_merges(merges)
    for key, add in (("bos_token", w.add_bos_token_id), ("eos_token", w.add_eos_token_id),
                     ("unk_token", w.add_unk_token_id), ("pad_token", w.add_pad_token_id)):
        if isinstance(cfg.get(key), str) and cfg[key] in vocab:
            add(vocab[cfg[key]])
    w.add_add_bos_token(bool(cfg.get("add_bos_token", False)))
    if cfg.get("chat_template"):
        w.add_chat_template(cfg["chat_template"])


def write_gguf(folder: Path, out: Path, types: dict[str, Any] | None = None) -> Path:
    """``folder`` (a Llama checkpoint) as the GGUF file ``out``; ``types`` (ggml name -> GGMLQuantizationType)
    stores those tensors quantized, every other one F32."""
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name(folder.name)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg.get("max_position_embeddings", 2048))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-5))
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_vocab_size(cfg["vocab_size"])
    _tokenizer(w, folder)
    tensors: dict[str, np.ndarray] = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    for name, data in tensors.items():
        data = data.astype(np.float32)
        if name.endswith("q_proj.weight"):
            data = permute(data, heads)
        elif name.endswith("k_proj.weight"):
            data = permute(data, kv_heads)
        add_tensor(w, gguf_name(name), data, types)
    finish(w)
    return out


def add_tensor(w: Any, name: str, data: np.ndarray, types: dict[str, Any] | None) -> None:
    """``data`` as F32, or quantized to ``types[name]`` (a gguf.GGMLQuantizationType) when it names one."""
    import gguf

    qtype = (types or {}).get(name)
    if qtype is None:
        w.add_tensor(name, data)
    else:
        w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)


def finish(w: Any) -> None:
    """Header, metadata and tensors written; the file closed."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_writer(path: Path, name: str, hidden: int, ffn: int, vocab: int, layers: int, context: int = 128) -> Any:
    """A GGUFWriter for a random Llama's file at ``path``: 2 heads, 1 KV head, context 128 (or ``context``), its
    hyperparameters written (the tensors are the caller's: ``llama_shapes``)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    for add, v in ((w.add_name, name), (w.add_block_count, layers), (w.add_context_length, context),
                   (w.add_embedding_length, hidden), (w.add_feed_forward_length, ffn), (w.add_head_count, 2),
                   (w.add_head_count_kv, 1), (w.add_layer_norm_rms_eps, 1e-5), (w.add_rope_freq_base, 10000.0),
                   (w.add_vocab_size, vocab)):
        add(v)
    return w


def llama_shapes(hidden: int, ffn: int, vocab: int, layers: int) -> dict[str, tuple[int, ...]]:
    """The ggml name and shape of each tensor of ``llama_writer``'s model (a tied head: no ``output.weight``)."""
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,)}
    for b in range(layers):
        shapes.update({f"blk.{b}.attn_norm.weight": (hidden,), f"blk.{b}.ffn_norm.weight": (hidden,),
                       f"blk.{b}.attn_q.weight": (hidden, hidden), f"blk.{b}.attn_k.weight": (hidden // 2, hidden),
                       f"blk.{b}.attn_v.weight": (hidden // 2, hidden), f"blk.{b}.attn_output.weight": (hidden, hidden),
                       f"blk.{b}.ffn_gate.weight": (ffn, hidden), f"blk.{b}.ffn_up.weight": (ffn, hidden),
                       f"blk.{b}.ffn_down.weight": (hidden, ffn)})
    return shapes

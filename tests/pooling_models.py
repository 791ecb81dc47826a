"""Random-weight pooling checkpoints built in the tests (no hub): a sentence-transformers "Llama encoder"
(LlamaModel + Pooling [+ Normalize]) and a one-label LlamaForSequenceClassification (a cross-encoder), both on the
tiny demo model's shapes and tokenizer."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

TINY = Path(__file__).resolve().parent.parent / "models" / "tiny"


def _config(tiny: Path, shape: dict[str, Any] | None = None) -> Any:
    from transformers import LlamaConfig
    cfg = LlamaConfig.from_pretrained(str(tiny))
    cfg.num_hidden_layers = 2  # small and fast; the shapes that matter (GQA, head_dim) stay the tiny model's
    for k, v in (shape or {}).items():  # a benchmark's real shape (tools/bench_embeddings.py)
        setattr(cfg, k, v)
    return cfg


def build_st_model(folder: Path, tiny: Path, method: str = "mean", normalize: bool = True,
                   matryoshka: bool = False, seed: int = 0, shape: dict[str, Any] | None = None) -> Path:
    """A sentence-transformers folder: Transformer(LlamaModel) -> Pooling(method) [-> Normalize]; ``shape``:
    LlamaConfig fields over the tiny model's (its tokenizer stays)."""
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoTokenizer, LlamaModel
    base = folder.parent / f"{folder.name}-base"
    cfg = _config(tiny, shape)
    if matryoshka:
        cfg.is_matryoshka = True
    torch.manual_seed(seed)
    LlamaModel(cfg).save_pretrained(str(base))
    tok = AutoTokenizer.from_pretrained(str(tiny))
    tok.padding_side = "right"  # a causal encoder's positions stay those of the unpadded input
    tok.chat_template = None  # sentence-transformers 6 wraps a text in the chat template where there is one
    tok.save_pretrained(str(base))
    t = models.Transformer(str(base))
    mods = [t, models.Pooling(t.get_embedding_dimension(), pooling_mode=method)]
    if normalize:
        mods.append(models.Normalize())
    SentenceTransformer(modules=mods, device="cpu").save(str(folder))
    return folder


def build_scorer(folder: Path, tiny: Path, seed: int = 0) -> Path:
    """A one-label LlamaForSequenceClassification with random weights and the tiny tokenizer."""
    from transformers import AutoTokenizer, LlamaForSequenceClassification
    cfg = _config(tiny)
    cfg.num_labels = 1
    cfg.architectures = ["LlamaForSequenceClassification"]
    torch.manual_seed(seed)
    model = LlamaForSequenceClassification(cfg)
    with torch.no_grad():  # a head of scale 1, so scores spread over the sigmoid rather than sit at 0.5
        model.score.weight.normal_(0, 1.0)
    model.save_pretrained(str(folder))
    AutoTokenizer.from_pretrained(str(tiny)).save_pretrained(str(folder))
    cfg_file = folder / "config.json"
    raw = json.loads(cfg_file.read_text())
    raw.setdefault("torch_dtype", "float32")
    cfg_file.write_text(json.dumps(raw))
    return folder

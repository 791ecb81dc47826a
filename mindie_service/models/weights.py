"""What both checkpoint loaders (plain and msModelSlim) do once every tensor has been copied in."""
from __future__ import annotations

from torch import nn


def tie_and_find_missing(model: nn.Module, params: dict[str, nn.Parameter], loaded: set[str],
                         tie: bool = True) -> list[str]:
    """After a checkpoint's tensors are copied in: a tied LM head shares the embeddings' tensor (one
    parameter, not a copy) when the checkpoint has no head of its own; returns the parameters still unloaded
    (a packed one counts when any of its shards, ``name#k``, was loaded). ``tie=False``: the caller ties the head
    itself (GGUF embeddings kept packed: models/gguf_packed.py)."""
    if "lm_head.weight" not in loaded and getattr(model.dims, "tie_embeddings", False):
        if not tie:
            loaded.add("lm_head.weight")
            return [n for n in params if n not in loaded and not any(k.startswith(n + "#") for k in loaded)]
        model.lm_head.weight = model.embed_tokens.weight  # type: ignore[union-attr]
        loaded.add("lm_head.weight")
    return [n for n in params if n not in loaded and not any(k.startswith(n + "#") for k in loaded)]

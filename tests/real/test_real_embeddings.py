"""Embeddings of the real SmolLM2 (a decoder LM: last-token pooling, not normalised) through the engine's pooling
room equal transformers' hidden state after the final norm at the last token, on the same .gguf, to 1e-4 cosine:
texts tokenized by each side, and token ids given as they are, several inputs in one forward."""
from __future__ import annotations

import numpy as np
import torch

TEXTS = ["The capital of France is Paris.", "Embeddings map text to vectors.", "A", "Rivers flow to the sea, "
         "carrying water from the mountains through valleys and cities."]


def test_smollm_last_token_embeddings_match_transformers(smollm_llm, hf_smollm):
    tok, model = hf_smollm
    assert "embed" in smollm_llm.pooling.tasks and smollm_llm.pooling.spec.method == "last"
    assert not smollm_llm.pooling.spec.normalize
    ids = [tok(t).input_ids for t in TEXTS]
    with torch.no_grad():
        want = np.stack([model.model(input_ids=torch.tensor([x])).last_hidden_state[0, -1].numpy() for x in ids])
    by_text = np.array(smollm_llm.embed(TEXTS))
    by_ids = np.array(smollm_llm.embed(ids))
    for got in (by_text, by_ids):
        assert got.shape == want.shape == (len(TEXTS), 576)
        cos = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
        assert (1 - cos).max() < 1e-4, cos
    assert np.allclose(by_text, by_ids, atol=1e-6)

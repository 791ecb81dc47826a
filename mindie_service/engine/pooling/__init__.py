"""Prefill-only requests (embeddings, scores): batched forwards between the engine's steps, no KV kept."""

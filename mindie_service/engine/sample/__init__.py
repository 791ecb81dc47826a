"""Choosing tokens: the sampler (sampler.py), rejection sampling of drafts (spec_accept.py), beam search as a
scheduler group (beam.py), and structured output's masks and forced tokens (grammar_masks.py)."""

"""Speculative decoding as part of the step: the speculator (speculator.py), the n-gram proposer (spec_ngram.py),
the draft-model proposer (spec_draft.py) and the per-row, per-step policy (spec_policy.py). Acceptance is
rejection sampling, beside the sampler (engine.sample.spec_accept)."""

"""The output cap, decided once: how many tokens a request may generate."""
from __future__ import annotations


def output_cap(max_tokens: int, prompt_len: int, *, max_iter_times: int, max_seq_len: int | None = None,
               pool_tokens: int | None = None) -> int:
    """``min(max_tokens, maxIterTimes, maxSeqLen - prompt_len, KV pool - prompt_len)``, at least 1 (a prompt
    the input processor let through always gets one token). A bound left None is not known to the caller
    (a batch job at submit knows no prompt yet); the engine applies them all."""
    cap = min(max_tokens, max_iter_times)
    if max_seq_len is not None:
        cap = min(cap, max_seq_len - prompt_len)
    if pool_tokens is not None:
        cap = min(cap, pool_tokens - prompt_len)
    return max(1, cap)

"""Greedy rows: each row's first maximum and its log-probability (logit - logsumexp), without the full
log-softmax. Shared by the engine's all-greedy sampling and its multi-step decode (the fused decode step's
bursts), so that a burst picks the tokens single steps would."""
from __future__ import annotations

import torch

from npu_ops import cpu_kernels


def first_maxima(logits: torch.Tensor) -> tuple[list[int], list[float]] | None:
    """logits [rows, vocab] -> (token ids, their log-probabilities); None where a logit is NaN or infinite."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.shape[1]:
        fused = cpu_kernels.greedy_rows(logits)  # the checks, argmax and logsumexp in one C call
        if fused is not None:
            return fused
    if not bool(logits.isfinite().all()):
        return None
    chosen = logits.argmax(-1)
    lp = logits.gather(1, chosen[:, None])[:, 0] - logits.logsumexp(-1)
    return chosen.tolist(), lp.tolist()

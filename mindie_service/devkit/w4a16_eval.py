"""W4A16's accuracy against the float model it was made from (issue 44; tools/accuracy_w4a16.py and
tests/unit/test_w4a16_accuracy.py): the float checkpoint requantized at load (``quantization: w4a16``: round to
nearest, groups of 128, asymmetric) and written as W4A16 checkpoints by the devkit's writer (devkit/w4a16_writer.py:
compressed-tensors, AutoAWQ gemm, msModelSlim), each run teacher-forced over the same tokens as the float model.

Per variant: top-1 agreement with the float model's predictions (every position), mean KL(float || w4a16) and the
NLL of the true next tokens beside the float model's; for a checkpoint also the same against its own weights
dequantized to float (``own``): the kernels' share, ~0, since the CPU blocks hold the checkpoint's values exactly and
take fp32 activations. The gap to the float model is int4 rounding's alone."""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from mindie_service.devkit import w4a16_writer
from mindie_service.devkit.quant_eval import teacher_forced_logprobs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Variant:
    name: str
    fmt: str | None  # a w4a16_writer format; None: ``quantization: w4a16`` at load
    group_size: int | None  # None: channel-wise
    symmetric: bool


VARIANTS = (
    Variant("w4a16 at load (g128 asym)", None, 128, False),
    Variant("compressed-tensors g128 sym", "compressed-tensors", 128, True),
    Variant("compressed-tensors g128 asym", "compressed-tensors", 128, False),
    Variant("compressed-tensors channel sym", "compressed-tensors", None, True),
    Variant("AutoAWQ gemm g128", "awq", 128, False),
    Variant("msModelSlim ascendV1 g128 asym", "msmodelslim", 128, False),
    Variant("msModelSlim MindIE channel sym", "msmodelslim-mindie", None, True),
)


@dataclass(frozen=True)
class Accuracy:
    variant: str
    positions: int
    top1: float  # agreement with the float model's argmax
    mean_kl: float  # KL(float || variant), nats
    nll: float  # mean NLL of the true next tokens, nats
    nll_float: float  # the float model's
    top1_own: float | None = None  # against the checkpoint's own weights dequantized (None: requantized at load)
    kl_own: float | None = None


@dataclass(frozen=True)
class Bound:
    """What a variant must hold against the float model, and against its own dequantized weights."""
    min_top1: float
    max_kl: float
    max_nll_rise: float
    min_top1_own: float = 0.998  # at most about one near-tie in 511 flipped by the order of fp32 sums
    max_kl_own: float = 1e-6

    def failures(self, a: Accuracy) -> list[str]:
        bad = []
        if a.top1 < self.min_top1:
            bad.append(f"top-1 {a.top1:.4f} < {self.min_top1}")
        if a.mean_kl > self.max_kl:
            bad.append(f"mean KL {a.mean_kl:.4f} > {self.max_kl}")
        if a.nll - a.nll_float > self.max_nll_rise:
            bad.append(f"NLL rise {a.nll - a.nll_float:.4f} > {self.max_nll_rise}")
        if a.top1_own is not None and a.top1_own < self.min_top1_own:
            bad.append(f"top-1 against its own weights {a.top1_own:.4f} < {self.min_top1_own}")
        if a.kl_own is not None and abs(a.kl_own) > self.max_kl_own:
            bad.append(f"KL against its own weights {a.kl_own:.2e} > {self.max_kl_own}")
        return bad


def targets_of(tokens: list[int], seq_len: int) -> torch.Tensor:
    """The true next token of each row ``teacher_forced_logprobs`` gives, [rows, 1]."""
    return torch.tensor([t for s in range(0, len(tokens) - seq_len + 1, seq_len)
                         for t in tokens[s + 1:s + seq_len]])[:, None]


def stats(ref: torch.Tensor, got: torch.Tensor, targets: torch.Tensor) -> tuple[float, float, float, float]:
    """(top-1 agreement, mean KL(ref || got), got's NLL, ref's NLL) over log-prob rows."""
    top1 = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    kl = (ref.exp() * (ref - got)).sum(-1).mean().item()
    return top1, kl, -got.gather(1, targets).mean().item(), -ref.gather(1, targets).mean().item()


def evaluate(float_dir: Path, tokens: list[int], work: Path, variants: tuple[Variant, ...] = VARIANTS,
             seq_len: int = 512, chunk: int = 128) -> Iterator[Accuracy]:
    """Each variant's Accuracy as soon as it is measured; ``work`` holds each checkpoint while it is measured."""
    targets = targets_of(tokens, seq_len)
    ref = teacher_forced_logprobs(float_dir, tokens, seq_len=seq_len, chunk=chunk)
    for v in variants:
        if v.fmt is None:
            got = teacher_forced_logprobs(float_dir, tokens, "w4a16", seq_len=seq_len, chunk=chunk)
            yield Accuracy(v.name, len(targets), *stats(ref, got, targets))
            continue
        folder = work / v.fmt
        w4 = w4a16_writer.write(float_dir, folder / "w4", v.fmt, v.group_size, v.symmetric)
        deq = w4a16_writer.reference(w4, folder / "dequantized")
        got = teacher_forced_logprobs(w4, tokens, seq_len=seq_len, chunk=chunk)
        own = teacher_forced_logprobs(deq, tokens, seq_len=seq_len, chunk=chunk)
        shutil.rmtree(folder, ignore_errors=True)
        top1_own, kl_own, _, _ = stats(own, got, targets)
        yield Accuracy(v.name, len(targets), *stats(ref, got, targets), top1_own, kl_own)

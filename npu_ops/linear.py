"""Linear layers with a CPU fast path: weights pre-packed once into oneDNN's blocked layout.

On this kind of machine (AVX2, PyTorch's CPU build) ``F.linear`` goes to MKL's sgemm, which is
slow for the skinny matrices of decoding (a few to a few dozen rows): oneDNN with a pre-packed
weight runs a decode step's projections 1.4-1.8x faster, and each output row no longer depends on
how many rows share the call. Packing is the same machinery PyTorch's own CPU inductor uses
(``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``). It is checked against
``F.linear`` when it is made and skipped, with the reason logged, wherever it is unavailable."""
from __future__ import annotations

import logging
import os

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

_PACK_CHECK_ROWS = 3


def onednn_linear_available() -> bool:
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class FastLinear(nn.Linear):
    """``nn.Linear`` that can pack its weight for oneDNN (``pack``). Until then, and wherever packing
    does not apply, it is an ordinary Linear (loaders and LoRA only see ``in_features`` and
    ``out_features`` and the checkpoint names)."""

    packed: torch.Tensor | None = None

    def pack(self, batch_hint: int, keep_dense: bool = True) -> bool:
        """Pack the current weight (call after loading). Returns False, leaving F.linear in use,
        where oneDNN is missing, the weight is not fp32 on the CPU, or the packed result disagrees.
        ``keep_dense=False`` then frees the dense copy: the packed one is all a CPU fp32 forward needs,
        and keeping both would double the weights' memory."""
        if self.packed is not None:
            return True
        w = self.weight
        if w.device.type != "cpu" or w.dtype != torch.float32 or not onednn_linear_available():
            return False
        with torch.no_grad():
            try:
                packed = torch.ops.mkldnn._reorder_linear_weight(w.detach().contiguous(), max(1, batch_hint))
                x = torch.randn(_PACK_CHECK_ROWS, self.in_features, generator=torch.Generator().manual_seed(0))
                got = torch.ops.mkldnn._linear_pointwise(x, packed, self.bias, "none", [None], "")
                want = F.linear(x, w, self.bias)
            except RuntimeError as exc:  # an op missing from this build
                logger.warning("oneDNN packed linear unavailable (%s); using F.linear", exc)
                return False
            if not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
                logger.warning("oneDNN packed linear disagrees with F.linear; using F.linear")
                return False
        self.packed = packed
        if not keep_dense:
            self.weight = None  # type: ignore[assignment]
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        if x.dtype != torch.float32 or x.device.type != "cpu":
            if self.weight is None:
                raise RuntimeError(f"this Linear's weight was packed for fp32 on the CPU; got {x.dtype} on {x.device}")
            return F.linear(x, self.weight, self.bias)
        if x.dim() != 2:
            return self.forward(x.reshape(-1, x.shape[-1])).view(*x.shape[:-1], self.out_features)
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [None], "")


def pack_linears(model: nn.Module, batch_hint: int) -> int:
    """Pack every FastLinear of ``model`` (its dense weights freed); returns how many were packed. ``MINDIE_CPU_KERNELS=0``
    (the switch for every CPU fast path, see npu_ops.cpu_kernels) leaves them all on F.linear."""
    if os.environ.get("MINDIE_CPU_KERNELS", "1") == "0":
        return 0
    n = sum(m.pack(batch_hint, keep_dense=False) for m in model.modules() if isinstance(m, FastLinear))
    if n:
        logger.info("packed %d linear weights for oneDNN (batch hint %d)", n, batch_hint)
    return n

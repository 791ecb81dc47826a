"""Linear layers with a CPU fast path: weights packed once for a GEMM that suits decoding.

On this kind of machine (AVX2, PyTorch's CPU build) ``F.linear`` goes to MKL's sgemm, which is
slow for the skinny matrices of decoding (a few to a few dozen rows). The project's own kernel
(npu_ops/csrc/gemm.c, built with the other CPU kernels) runs a decode step's projections about
1.8-2.5x faster than MKL and 1.2-1.5x faster than oneDNN with a pre-packed weight, and matches
oneDNN on prefill-sized batches. Where the CPU kernels cannot be built, oneDNN's packing (the
machinery PyTorch's own CPU inductor uses: ``torch.ops.mkldnn._reorder_linear_weight`` /
``_linear_pointwise``) is next. Each packing is checked against ``F.linear`` when it is made and
skipped, with the reason logged, where it disagrees or is unavailable. "Disagrees" is judged as a
GEMM's accuracy is stated: two fp32 dot products of length K may differ by up to about
K * eps32 * sum_k |x_k| |w_k| (``fp32_gemm_tolerance``), a bound that grows with K and the operands'
magnitudes, so a correct kernel passes on real weights and a wrong one (a term lost or misplaced)
does not."""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from npu_ops import cpu_kernels

logger = logging.getLogger(__name__)

_PACK_CHECK_ROWS = 3


def onednn_linear_available() -> bool:
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class FastLinear(nn.Linear):
    """``nn.Linear`` that can pack its weight for a faster CPU GEMM (``pack``): the project's own
    kernel (npu_ops/csrc/gemm.c) where the CPU kernels are built, else oneDNN's. Until then, and
    wherever packing does not apply, it is an ordinary Linear (loaders and LoRA only see
    ``in_features``, ``out_features`` and the checkpoint names)."""

    packed: torch.Tensor | None = None
    packed_kind: str = ""  # "csrc" | "onednn"

    def reset_parameters(self) -> None:
        """nn.Linear's random init, but none on the meta device (the loader builds there, then fills every weight
        from the checkpoint): it draws nothing there, yet its first run faults in the meta kernels' code for good
        (~1 MB resident, issue 44)."""
        if not self.weight.is_meta:
            super().reset_parameters()

    def pack(self, batch_hint: int, keep_dense: bool = True) -> bool:
        """Pack the current weight (call after loading). Returns False, leaving F.linear in use,
        where no packed GEMM is available, the weight is not fp32 on the CPU, or the packed result
        disagrees with F.linear. ``keep_dense=False`` then frees the dense copy: the packed one is
        all a CPU fp32 forward needs, and keeping both would double the weights' memory."""
        if self.packed is not None:
            return True
        w = self.weight
        if w.device.type != "cpu" or w.dtype != torch.float32:
            return False
        kinds = (["csrc"] if cpu_kernels.load() is not None else []) + (["onednn"] if onednn_linear_available() else [])
        with torch.no_grad():
            x = torch.randn(_PACK_CHECK_ROWS, self.in_features, generator=torch.Generator().manual_seed(0))
            want = F.linear(x, w, self.bias)
            for kind in kinds:
                try:
                    packed = _pack(kind, w, batch_hint)
                    got = _apply(kind, x, packed, self.out_features, self.bias)
                except RuntimeError as exc:  # an op missing from this build
                    logger.warning("%s packed linear unavailable (%s)", kind, exc)
                    continue
                if within_fp32_gemm_error(got, want, x, w, self.bias):
                    self.packed, self.packed_kind = packed, kind
                    break
                logger.warning("%s packed linear disagrees with F.linear; not used", kind)
        if self.packed is None:
            return False
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
        return _apply(self.packed_kind, x, self.packed, self.out_features, self.bias)


def fp32_gemm_tolerance(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Per-element bound [M, N] on |a - b| for two fp32 evaluations of ``x @ w.T + bias``, each summing in its
    own order: each is within K * u * sum_k |x_k w_k| of the exact value (u = eps32 / 2, Higham's
    gamma_K to first order), so they are within K * eps32 * (|x| @ |w|^T + |bias|) of each other."""
    mag = x.abs().float() @ w.abs().float().T
    if bias is not None:
        mag = mag + bias.abs().float()
    return x.shape[-1] * torch.finfo(torch.float32).eps * mag + torch.finfo(torch.float32).tiny


def within_fp32_gemm_error(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                           bias: torch.Tensor | None = None) -> bool:
    """True where ``got`` and ``want`` (two computations of ``x @ w.T + bias``) agree within an fp32 GEMM's
    error bound (``fp32_gemm_tolerance``) everywhere, and ``got`` is finite wherever ``want`` is."""
    if got.shape != want.shape:
        return False
    diff = (got.float() - want.float()).abs()
    ok = (diff <= fp32_gemm_tolerance(x, w, bias)) | (~torch.isfinite(want) & (got == want))
    return bool(ok.all())


def _pack(kind: str, w: torch.Tensor, batch_hint: int) -> torch.Tensor:
    if kind == "csrc":
        return cpu_kernels.pack_weight(w)
    return torch.ops.mkldnn._reorder_linear_weight(w.detach().contiguous(), max(1, batch_hint))


def _apply(kind: str, x: torch.Tensor, packed: torch.Tensor, out_features: int,
           bias: torch.Tensor | None) -> torch.Tensor:
    if kind == "csrc":
        return cpu_kernels.linear(x, packed, out_features, bias)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [None], "")


def pack_linears(model: nn.Module, batch_hint: int) -> int:
    """Pack every FastLinear of ``model`` (its dense weights freed); returns how many were packed.
    With the CPU fast paths switched off (``cpu_kernels.switched_off``: the engine config or
    ``MINDIE_CPU_KERNELS=0``) they all stay on F.linear."""
    if cpu_kernels.switched_off():
        return 0
    mods = [m for m in model.modules() if isinstance(m, FastLinear)]
    n = sum(m.pack(batch_hint, keep_dense=False) for m in mods)
    if n:
        kinds = sorted({m.packed_kind for m in mods if m.packed is not None})
        logger.info("packed %d linear weights (%s)", n, ", ".join(kinds))
    return n

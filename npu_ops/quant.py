"""int8 weight quantization: the one portable PyTorch reference and the drop-in ``QuantLinear``.

Schemes (``SCHEMES``):
- ``w8a16``: int8 weights with one scale per output channel (symmetric, [-127, 127]); activations
  stay in the model dtype: ``y = (x . Wq^T) * w_scale + bias``.
- ``w8a8``: the same weights; each activation row (token) is quantized on the fly to int8 with its
  own scale (dynamic, symmetric), products accumulate in int32:
  ``y = (xq . Wq^T) * x_scale[m] * w_scale[n] + bias``.
- ``w8i16`` (``HEAD_SCHEME``, the int8 LM head's): the same weights; each activation row quantized on the
  fly to int16 (scale amax / 16383), products summed exactly in int32 by chunks of 1,024 k, the chunks added in
  fp32: ``y = acc * (x_scale[m] * w_scale[n]) + bias``. Its error is the int8 weights' (the activation step is
  1/16383 of the row's amax); the CPU kernel (csrc/gemm_w8i16.c) multiplies int16 pairs in one instruction
  where W8A16 widens every weight to fp32. Other devices run it as ``w8a16``.
- ``w8a8_static`` (msModelSlim's ``W8A8``): a per-tensor activation scale and offset fixed by
  calibration: ``xq = clamp(round(x / input_scale + input_offset))``, ``y = (xq . Wq^T + quant_bias) * deq_scale``.

Quantization is applied from outside the model (gpt-fast style): ``quantize_model`` swaps each
``FastLinear`` for a ``QuantLinear`` one module at a time, freeing the full-precision weight as it
goes, so a model is never held twice. Per device the fast path is: the CPU's C kernels
(csrc/gemm_int8.c, via npu_ops.quant_cpu), Ascend's ``torch_npu.npu_weight_quant_batchmatmul`` /
``npu_quant_matmul``, CUDA's ``torch._int_mm`` (the Triton kernel for the shapes it refuses); everything
else runs the reference below."""
from __future__ import annotations

import importlib
import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from npu_ops import cpu_kernels, quant_cpu, triton_support

logger = logging.getLogger(__name__)

SCHEMES = ("w8a16", "w8a8")
HEAD_SCHEME = "w8i16"  # the output projection's only (quantize_lm_head)
QMAX = 127
I16_QMAX = 16383  # csrc/quantize_rows.h
I16_CHUNK = 1024  # k a chunk of exact int32 sums (csrc/gemm_w8i16.c)


# ---------------------------------------------------------------- reference math
def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> (int8 [N, K], fp32 scale [N]): symmetric per output channel."""
    wf = w.detach().float()
    scale = wf.abs().amax(dim=1).clamp(min=1e-12) / QMAX
    q = torch.round(wf / scale[:, None]).clamp_(-QMAX, QMAX).to(torch.int8)
    return q, scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] float -> (int8 [M, K], fp32 scale [M]): symmetric per row (per token), dynamic. A zero row
    gets scale 1 (csrc/gemm_int8.c does the same)."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))
    q = torch.round(xf / scale[..., None]).clamp_(-QMAX, QMAX).to(torch.int8)
    return q, scale


def int_matmul_ref(xq: torch.Tensor, wq: torch.Tensor) -> torch.Tensor:
    """Exact int32 xq [M, K] . wq[N, K]^T (float64 holds every partial sum of int8 products exactly)."""
    return (xq.double() @ wq.double().T).round().to(torch.int32)


def w8a16_ref(x: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = F.linear(x.float(), wq.float()) * w_scale.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def w8a8_ref(x: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    xq, xs = quantize_rows(x)
    y = int_matmul_ref(xq, wq).float() * xs[:, None] * w_scale.float()[None, :]
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def w8i16_ref(x: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The W8I16 head (csrc/gemm_w8i16.c), bit for bit: int16 rows, exact int32 chunk sums added in fp32."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1)
    xs = torch.where(amax > 0, amax / I16_QMAX, torch.ones_like(amax))
    xq = torch.round(xf / xs[..., None]).clamp_(-I16_QMAX, I16_QMAX)
    acc = torch.zeros(x.shape[0], wq.shape[0], device=x.device)
    for k0 in range(0, x.shape[1], I16_CHUNK):  # float64 holds every chunk sum exactly
        acc += (xq[:, k0:k0 + I16_CHUNK].double() @ wq[:, k0:k0 + I16_CHUNK].double().T).float()
    y = acc * (xs[:, None] * w_scale.float()[None, :])
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def w8a8_static_ref(x: torch.Tensor, wq: torch.Tensor, input_scale: torch.Tensor, input_offset: torch.Tensor,
                    deq_scale: torch.Tensor, quant_bias: torch.Tensor) -> torch.Tensor:
    """msModelSlim's W8A8 formulas, literally (its int8 range is the signed [-128, 127])."""
    xq = torch.round(x.float() / input_scale.float() + input_offset.float()).clamp_(-128, 127).to(torch.int8)
    acc = int_matmul_ref(xq, wq) + quant_bias.to(torch.int32)
    return (acc.float() * deq_scale.float()).to(x.dtype)


# ---------------------------------------------------------------- the module
class QuantLinear(nn.Module):
    """A linear layer over int8 weights. LoRA and the loaders see what they see of a FastLinear:
    ``in_features``, ``out_features`` (LoRA deltas are added to its output in full precision)."""

    def __init__(self, in_features: int, out_features: int, scheme: str, wq: torch.Tensor, w_scale: torch.Tensor,
                 bias: torch.Tensor | None = None, static: dict[str, torch.Tensor] | None = None) -> None:
        super().__init__()
        if scheme not in (*SCHEMES, HEAD_SCHEME, "w8a8_static"):
            raise ValueError(f"unknown quantization scheme {scheme!r}")
        self.in_features, self.out_features, self.scheme = in_features, out_features, scheme
        self.register_buffer("qweight", wq.to(torch.int8).contiguous())
        self.register_buffer("w_scale", w_scale.float().reshape(-1).contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())
        self.static_names = tuple(static or {})  # msModelSlim W8A8: input_scale, input_offset, deq_scale, quant_bias
        for k, v in (static or {}).items():
            self.register_buffer(k, v)
        self.packed: torch.Tensor | None = None  # the CPU kernel's layout (quant_cpu), when packed
        self.path = "reference"

    @classmethod
    def from_float(cls, linear: nn.Linear, scheme: str) -> "QuantLinear":
        wq, scale = quantize_weight(linear.weight)
        return cls(linear.in_features, linear.out_features, scheme, wq, scale, linear.bias)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, scheme={self.scheme}, path={self.path}"

    def pack_for_cpu(self) -> bool:
        """Pack for the C kernels (frees the plain int8 copy); False where they are not available."""
        if self.scheme == "w8a8_static" or self.qweight.device.type != "cpu" or cpu_kernels.switched_off():
            return False
        if not quant_cpu.available():
            return False
        self.packed = quant_cpu.pack(self.qweight, self.scheme)
        self.path = "cpu-int8"
        self.qweight = torch.empty(0, dtype=torch.int8)  # the packed copy is all a CPU forward needs
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return self.forward(x.reshape(-1, x.shape[-1])).view(*x.shape[:-1], self.out_features)
        dev = x.device.type
        if self.packed is not None and dev == "cpu" and x.dtype == torch.float32:
            return quant_cpu.linear(x, self.packed, self.scheme, self.w_scale, self.in_features, self.out_features,
                                    self.bias)
        if self.packed is not None:
            raise RuntimeError(f"this QuantLinear was packed for fp32 on the CPU; got {x.dtype} on {x.device}")
        if dev == "npu":
            return _npu_forward(self, x)
        if dev == "cuda" and self.scheme == "w8a8":
            return _cuda_w8a8(x, self.qweight, self.w_scale, self.bias)
        return self.reference(x)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        if self.scheme == "w8a16":
            return w8a16_ref(x, self.qweight, self.w_scale, self.bias)
        if self.scheme == HEAD_SCHEME:
            return w8i16_ref(x, self.qweight, self.w_scale, self.bias)
        if self.scheme == "w8a8":
            return w8a8_ref(x, self.qweight, self.w_scale, self.bias)
        return w8a8_static_ref(x, self.qweight, *(getattr(self, n) for n in
                                                  ("input_scale", "input_offset", "deq_scale", "quant_bias")))


# ---------------------------------------------------------------- accelerator paths
def _torch_npu() -> Any:
    return importlib.import_module("torch_npu")


def _npu_forward(m: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    """Ascend: int8 weights go as [K, N] (x2 / weight), scales as 1-D [N] (torch_npu's documented contracts)."""
    tnpu = _torch_npu()
    if m.scheme in ("w8a16", HEAD_SCHEME):  # the int8 head: fp16/bf16 activations there
        y = tnpu.npu_weight_quant_batchmatmul(x, m.qweight.T, m.w_scale.to(x.dtype))
        return y if m.bias is None else y + m.bias.to(y.dtype)
    if m.scheme == "w8a8":
        xq, xs = tnpu.npu_dynamic_quant(x)
        y = tnpu.npu_quant_matmul(xq, m.qweight.T, m.w_scale, pertoken_scale=xs.reshape(-1),
                                  output_dtype=x.dtype if x.dtype == torch.bfloat16 else torch.float16)
        y = y.to(x.dtype)
        return y if m.bias is None else y + m.bias.to(y.dtype)
    return m.reference(x)


def _cuda_w8a8(x: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """torch._int_mm wants M > 16 and K, N multiples of 8; other shapes (every decode step's) run the Triton
    kernel (npu_ops/triton_w8a8.py), or the reference where Triton is not installed."""
    m, k = x.shape
    if m <= 16 or k % 8 or wq.shape[0] % 8:
        if not triton_support.usable("cuda"):
            return w8a8_ref(x, wq, w_scale, bias)
        xq, xs = quantize_rows(x)
        return importlib.import_module("npu_ops.triton_w8a8").w8a8_matmul(xq, xs, wq, w_scale, bias, x.dtype)
    xq, xs = quantize_rows(x)
    acc = torch._int_mm(xq, wq.T)
    y = acc.float() * xs[:, None] * w_scale[None, :]
    return (y if bias is None else y + bias).to(x.dtype)


# ---------------------------------------------------------------- applying it to a model
# Kept in full precision, as msModelSlim does by default: the output projection decides the top-1
# token among near-ties, and costs one matmul per sampled row only.
KEEP_FLOAT = ("lm_head",)


def quantize_model(model: nn.Module, scheme: str, keep_float: tuple[str, ...] = KEEP_FLOAT) -> int:
    """Swap every nn.Linear (FastLinear) of ``model`` but ``keep_float`` for a QuantLinear, one at a time
    (the float weight of each is freed before the next is quantized). Returns how many were swapped."""
    if scheme not in SCHEMES:
        raise ValueError(f"quantization must be one of {list(SCHEMES)} or None, got {scheme!r}")
    targets = [(name, mod) for name, mod in model.named_modules()
               if isinstance(mod, nn.Linear) and name.rpartition(".")[2] not in keep_float]
    for name, mod in targets:
        if mod.weight is None:
            raise RuntimeError(f"{name}: its dense weight was already freed by packing; quantize before pack_linears")
        swap_module(model, name, QuantLinear.from_float(mod, scheme).to(mod.weight.device))
    return len(targets)


def swap_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, attr, new)


def pack_quantized(model: nn.Module, act_dtype: torch.dtype = torch.float32) -> int:
    """Pack every QuantLinear for the CPU kernels where they apply (fp32 activations: the kernels' only
    kind); returns how many were packed."""
    if act_dtype != torch.float32:
        return 0
    n = sum(m.pack_for_cpu() for m in model.modules() if isinstance(m, QuantLinear))
    if n:
        logger.info("packed %d int8 linear weights for the CPU kernels", n)
    return n

"""Modules over GGUF block-quantized weights kept as stored (npu_ops.quant_gguf): a linear layer and an embedding.

``GgufLinear`` holds its weight as one or more parts (``GgufWeight``), stacked along the output: a packed qkv or
gate/up whose checkpoint tensors differ in type (Q4_K_M: q/k in Q4_K, v in Q6_K) keeps each part in its own type.
On the CPU with the kernels built it runs csrc/gguf_linear.c over the parts' segment table (a call of a step kind
``int8_steps`` names on the types' int8-activation kernels, ``quant_gguf.matmul_q8_ref``'s numerics; the kind is
the caller's ``gguf_step``: a decode step or a prefill piece; a prefill piece on fp32 activations runs
csrc/gemm_gguf_tile.c's tiles, ``prefill_tiles``); anywhere
else the reference (dequantize, then ``F.linear``), slow but exact. LoRA and the loaders see what they see of a FastLinear:
``in_features``, ``out_features`` (LoRA deltas are added to its output). ``GgufEmbedding`` dequantizes only the
rows a lookup reads; a tied LM head is a GgufLinear over the embedding's own GgufWeight (one copy of the bytes)."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import nn

from npu_ops import gguf_cpu
from npu_ops.quant_gguf import GgufWeight


# The kind of step a forward belongs to (csrc/gguf_linear.h's GGUF_STEP_*): the runner sets it around each piece it
# runs (engine/runner/model_runner.py); a context variable, so it holds for the thread (or task) that set it only
STEP_PREFILL, STEP_DECODE = 0, 1
INT8_DECODE, INT8_ALL = 1 << STEP_DECODE, (1 << STEP_DECODE) | (1 << STEP_PREFILL)  # GgufLinear.int8_steps masks
_STEP: ContextVar[int] = ContextVar("gguf_step", default=STEP_PREFILL)


@contextmanager
def gguf_step(kind: int) -> Iterator[None]:
    """The packed linears called inside run as a step of ``kind`` (STEP_PREFILL or STEP_DECODE) would."""
    token = _STEP.set(kind)
    try:
        yield
    finally:
        _STEP.reset(token)


def current_step() -> int:
    """The step kind the calling context runs (STEP_PREFILL outside any ``gguf_step``)."""
    return _STEP.get()


class GgufLinear(nn.Module):
    def __init__(self, parts: list[GgufWeight], bias: torch.Tensor | None = None) -> None:
        super().__init__()
        ks = {p.shape[1] for p in parts}
        if not parts or len(ks) != 1:
            raise ValueError(f"a GGUF linear's parts must share their input size, got {[p.shape for p in parts]}")
        self.parts = parts
        self.in_features, self.out_features = ks.pop(), sum(p.shape[0] for p in parts)
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())
        self._segs: torch.Tensor | None = None
        self._segs_key: tuple[int, ...] = ()
        self._on_kernels: bool | None = None
        # Bit (1 << STEP_*) set: calls of that step kind take the parts' int8-activation kernels (0: never;
        # models/loader.py sets it from ModelConfig.ggufActivations, gguf_packed.set_activations)
        self.int8_steps = 0
        # Prefill pieces on fp32 activations run csrc/gemm_gguf_tile.c's tiles: our fp32 sgemm's bits over the
        # dequantized weights, so a packed prefill is the dequantized reference's (the LM head's too, whose few
        # rows a step pay ~2.5x the packed kernel's time for it); False keeps the packed kernel (the kernels' own
        # tests). Either way by the layer, never by the row count
        self.prefill_tiles = True

    @property
    def kinds(self) -> list[str]:
        return [p.kind for p in self.parts]

    def extra_repr(self) -> str:
        kinds = [k for k, bit in (("decode", STEP_DECODE), ("prefill", STEP_PREFILL)) if self.int8_steps >> bit & 1]
        int8 = f", int8 activations in {' and '.join(kinds)} steps" if kinds else ""
        tiles = ", prefill on fp32 tiles" if self.prefill_tiles and not self.int8_steps >> STEP_PREFILL & 1 else ""
        return f"in={self.in_features}, out={self.out_features}, types={'+'.join(self.kinds)}{int8}{tiles}"

    def runs_on_cpu_kernels(self) -> bool:
        if self._on_kernels is None:
            self._on_kernels = all(gguf_cpu.runnable(p.kind) is None for p in self.parts)
        return self._on_kernels

    def segments(self) -> torch.Tensor:
        """csrc/gguf_linear.h's segment table of the parts, rebuilt when a part's bytes moved (the arena)."""
        key = (*(p.data.data_ptr() for p in self.parts), self.int8_steps, self.prefill_tiles)
        if self._segs is None or key != self._segs_key:
            new = gguf_cpu.segments(self.parts, self.int8_steps, self.prefill_tiles)
            if self._segs is not None and self._segs.shape == new.shape:
                with torch.inference_mode():  # allowed there on a table made in or out of inference mode
                    self._segs.copy_(new)  # in place: a fused layer table holding its address reads the new one
            else:
                self._segs = new
            self._segs_key = key
        return self._segs

    @property
    def packed(self) -> torch.Tensor | None:
        """The segment table the C kernels take (None where they do not run this layer): the fused paths' key."""
        return self.segments() if self.runs_on_cpu_kernels() else None

    def dequantized(self) -> torch.Tensor:
        return torch.cat([p.dequantize() for p in self.parts])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return self.forward(x.reshape(-1, x.shape[-1])).view(*x.shape[:-1], self.out_features)
        if x.device.type == "cpu" and x.dtype == torch.float32 and self.runs_on_cpu_kernels():
            return gguf_cpu.linear(x, self.segments(), self.in_features, self.out_features, self.bias, _STEP.get())
        return self.reference(x)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        w = self.dequantized().to(x.device)
        b = None if self.bias is None else self.bias.to(x.device)
        return F.linear(x.float(), w, b).to(x.dtype)


class GgufEmbedding(nn.Module):
    def __init__(self, weight: GgufWeight) -> None:
        super().__init__()
        self.weight_q = weight
        self.num_embeddings, self.embedding_dim = weight.shape

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, type={self.weight_q.kind}"

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.weight_q.rows(ids.reshape(-1).to(self.weight_q.data.device))
        return rows.view(*ids.shape, self.embedding_dim).to(ids.device)

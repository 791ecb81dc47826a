"""CUDA graphs for decode steps: one graph per batch-size bucket, captured at the bucket's first step after a
warm-up run, then replayed with each step's inputs copied into the bucket's static buffers.

A decode step on CUDA is hundreds of small kernel launches (a thin model's layers), each costing more host time
than the GPU spends in it; a graph replays them in one launch. What a graph holds is the forward from the token
ids to the logits: the static buffers are the token ids, positions, KV slots and block tables (padded rows write
to slot -1, which the Triton KV write skips, and read block 0), and the attention reads only tensors (the
Triton row kernel), never host values. Sampling, penalties and grammar masks work on the logits after the
graph, so constrained rows replay too. Eager, because a graph cannot hold them: prefill and chunked-prefill
steps (their shapes vary with every prompt), LoRA rows (the adapter applier is built in Python per step),
speculative verify rows (several rows a sequence), a batch above the largest bucket, and a device without
the Triton kernels (the reference attention builds masks from host values). The capture/bucket/replay logic
takes its graph backend as a value, so a stand-in holds it where no GPU exists (tests/unit/test_cuda_graphs.py)."""
from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch
from torch import nn

from mindie_service.models.llama import StepContext
from npu_ops import triton_support
from npu_ops.ops import AttentionMetadata

logger = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


@dataclass(frozen=True)
class GraphPlan:
    max_batch: int  # the largest bucket (maxBatchSize, rounded up to a bucket)
    max_blocks: int  # block-table width of the static buffers (maxSeqLen in blocks)


def graph_plan(enabled: bool, device: torch.device, max_batch: int, max_seq_len: int,
               block_size: int) -> GraphPlan | None:
    """The plan on CUDA with the Triton kernels; None (eager) elsewhere or where switched off, with why."""
    if not enabled or device.type != "cuda":
        return None
    ok, why = triton_support.status("cuda")
    if not ok:
        logger.info("CUDA graphs off: the decode step's attention needs the Triton kernels (%s)", why)
        return None
    top = BUCKETS[min(bisect.bisect_left(BUCKETS, max_batch), len(BUCKETS) - 1)]
    return GraphPlan(top, -(-max_seq_len // block_size))


class GraphBackend(Protocol):
    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor]: ...

    def replay(self, graph: Any) -> None: ...


class CudaGraphBackend:
    """torch.cuda.CUDAGraph, every bucket's graph in one memory pool (buckets never run at once)."""

    def __init__(self) -> None:
        self.pool: Any = None

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # the warm-up run off the capture: Triton compiles, allocators settle
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        if self.pool is None:
            self.pool = graph.pool()
        return graph, out

    def replay(self, graph: Any) -> None:
        graph.replay()


@dataclass
class _Bucket:
    graph: Any
    logits: torch.Tensor


class DecodeGraphs:
    """Static buffers sized for the largest bucket; bucket ``b`` runs on their first ``b`` rows."""

    def __init__(self, model: nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device,
                 plan: GraphPlan, backend: GraphBackend | None = None) -> None:
        self.model, self.kv_caches, self.plan = model, kv_caches, plan
        self.backend = backend if backend is not None else CudaGraphBackend()
        n, w = plan.max_batch, plan.max_blocks
        self.ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slots = torch.full((n,), -1, dtype=torch.long, device=device)
        self.tables = torch.zeros(n, w, dtype=torch.int32, device=device)
        self.rows = torch.arange(n, dtype=torch.int32, device=device)
        self.buckets: dict[int, _Bucket] = {}
        self.replays = 0

    def bucket(self, n: int) -> int | None:
        i = bisect.bisect_left(BUCKETS, n)
        return BUCKETS[i] if i < len(BUCKETS) and BUCKETS[i] <= self.plan.max_batch else None

    def takes(self, n: int, widest_table: int) -> bool:
        return n > 0 and self.bucket(n) is not None and widest_table <= self.plan.max_blocks

    def _forward(self, b: int) -> torch.Tensor:
        """The graph's body over the first ``b`` rows of the static buffers."""
        pos32 = self.positions[:b].to(torch.int32)
        meta = AttentionMetadata(slots=self.slots[:b], num_decode=b, block_tables=self.tables[:b],
                                 row_seq=self.rows[:b], row_pos=pos32, decode_block_tables=self.tables[:b],
                                 decode_ctx_lens=pos32 + 1)
        hidden = self.model(self.ids[:b], StepContext(positions=self.positions[:b], attn=meta), self.kv_caches)
        return self.model.compute_logits(hidden)

    def run(self, ids: list[int], positions: list[int], slots: list[int],
            tables: list[tuple[int, ...]]) -> torch.Tensor:
        """Logits [len(ids), vocab] of one decode step: copy into the static buffers, then replay the bucket's
        graph (captured first if this is the bucket's first step)."""
        n = len(ids)
        b = self.bucket(n)
        assert b is not None, f"{n} rows take no bucket"
        dev = self.ids.device
        self.ids[:n].copy_(torch.tensor(ids, device=dev))
        self.positions[:n].copy_(torch.tensor(positions, device=dev))
        self.slots[:n].copy_(torch.tensor(slots, device=dev))
        self.slots[n:b].fill_(-1)  # padded rows write nowhere
        self.tables[:b].zero_()
        width = max(len(t) for t in tables)
        self.tables[:n, :width].copy_(torch.tensor([t + (0,) * (width - len(t)) for t in tables], dtype=torch.int32,
                                                   device=dev))
        self.positions[n:b].zero_()
        entry = self.buckets.get(b)
        if entry is None:
            graph, logits = self.backend.capture(lambda: self._forward(b))
            entry = self.buckets[b] = _Bucket(graph, logits)
            logger.info("CUDA graph captured for decode steps of up to %d rows", b)
        self.backend.replay(entry.graph)
        self.replays += 1
        return entry.logits[:n]

"""The pooling room: prefill-only requests (embeddings, scores) batched through the engine's model runner.

The engine thread runs ``PoolBatcher.step`` between generation steps: it packs the waiting inputs (each a whole
prompt; up to ``max_tokens`` tokens a forward, at least one input), gives each input blocks of the shared KV pool
for the forward only (the attention kernels read K/V from there), runs one forward without sampling, pools each
input's hidden states (models/pooling_spec.py) or reads the score head at its last token, and frees the blocks at
once: nothing enters the prefix cache, no decode slot is taken. An input that finds no free blocks waits for the
generation steps to free some."""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from mindie_service.engine.contract import PoolRequest, PoolResult
from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.sequence import Sequence
from mindie_service.engine.step import ScheduledChunk
from mindie_service.errors import GenerationError, OverloadedError
from mindie_service.models.pooling_spec import PoolingSpec, pool, truncate
from mindie_service.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

Outcome = tuple[str, PoolResult | Exception]
HiddenFn = Callable[[list[ScheduledChunk]], torch.Tensor]  # whole-prompt chunks -> final hidden states [T, width]
HeadFn = Callable[[torch.Tensor], torch.Tensor]  # hidden rows -> the score head's outputs [rows, labels]


@dataclass
class _Job:
    req: PoolRequest
    done: dict[int, list[float]] = field(default_factory=dict)
    next: int = 0  # the first input not yet scheduled

    @property
    def finished(self) -> bool:
        return len(self.done) == len(self.req.inputs)


class PoolBatcher:
    """Waiting pooling requests and the forward that serves them (engine thread only)."""

    def __init__(self, blocks: BlockManager, hidden: HiddenFn, head: HeadFn, spec: PoolingSpec,
                 max_tokens: int) -> None:
        self.blocks, self.hidden, self.head, self.spec = blocks, hidden, head, spec
        self.max_tokens = max_tokens
        self.pending: deque[_Job] = deque()

    def add(self, req: PoolRequest) -> None:
        self.pending.append(_Job(req))

    def abort(self, request_id: str) -> None:
        self.pending = deque(j for j in self.pending if j.req.request_id != request_id)

    def has_work(self) -> bool:
        return bool(self.pending)

    def step(self, generating: bool) -> list[Outcome]:
        """One forward over as many waiting inputs as fit; the requests it completes (or fails). ``generating``:
        the engine has generation work that will free blocks; without it an input that finds no room fails."""
        seqs, owners = self._take()
        if not seqs:
            if generating:
                return []
            job = self.pending.popleft()
            return [(job.req.request_id, OverloadedError(
                "the KV pool has no free blocks for this input now (kept sessions hold them); retry later"))]
        try:
            self._run(seqs, owners)
        except Exception as exc:  # noqa: BLE001 - the requests of this batch fail, the engine goes on
            logger.exception("pooling forward of %d inputs failed", len(seqs))
            failed = {id(j): j for j, _ in owners}
            self.pending = deque(j for j in self.pending if id(j) not in failed)
            return [(j.req.request_id, GenerationError(f"Request {j.req.request_id} failed in the engine"))
                    for j in failed.values()]
        finally:
            for s in seqs:
                self.blocks.free_seq(s)  # no KV kept: the blocks go back at once, never into the prefix cache
        out: list[Outcome] = []
        while self.pending and self.pending[0].finished:
            job = self.pending.popleft()
            vectors = [job.done[i] for i in range(len(job.req.inputs))]
            out.append((job.req.request_id, PoolResult(job.req.request_id, vectors,
                                                       sum(len(x) for x in job.req.inputs))))
        return out

    def _take(self) -> tuple[list[Sequence], list[tuple[_Job, int]]]:
        """Allocate blocks for the next inputs in arrival order, up to ``max_tokens`` tokens (one input always)."""
        seqs: list[Sequence] = []
        owners: list[tuple[_Job, int]] = []
        budget = self.max_tokens
        for job in self.pending:
            while job.next < len(job.req.inputs):
                ids = job.req.inputs[job.next]
                if seqs and len(ids) > budget:
                    return seqs, owners
                seq = Sequence(f"{job.req.request_id}#pool{job.next}", list(ids), _PARAMS, 1, 0)
                if not self.blocks.allocate(seq, use_prefix_cache=False):
                    return seqs, owners
                seqs.append(seq)
                owners.append((job, job.next))
                job.next += 1
                budget -= len(ids)
        return seqs, owners

    def _run(self, seqs: list[Sequence], owners: list[tuple[_Job, int]]) -> None:
        chunks = [ScheduledChunk(s.request_id, 0, tuple(s.prompt_token_ids), tuple(s.block_table), sample=False)
                  for s in seqs]
        hidden = self.hidden(chunks)
        spans, start = [], 0
        for c in chunks:
            spans.append((start, c.num_tokens))
            start += c.num_tokens
        by_task: dict[str, list[int]] = {}
        for k, (job, _) in enumerate(owners):
            by_task.setdefault(job.req.task, []).append(k)
        rows: dict[int, list[float]] = {}
        for task, ks in by_task.items():
            if task == "score":  # the one-label head at each input's last token (LlamaForSequenceClassification),
                # through a sigmoid: sentence-transformers' CrossEncoder default and vLLM's score for one label
                last = torch.tensor([spans[k][0] + spans[k][1] - 1 for k in ks], device=hidden.device)
                got = torch.sigmoid(self.head(hidden[last]).float())
            else:
                got = pool(hidden, [spans[k] for k in ks], self.spec)
            for k, vec in zip(ks, got):
                rows[k] = _truncated(vec, owners[k][0].req.dimensions)
        for k, (job, i) in enumerate(owners):
            job.done[i] = rows[k]


def _truncated(vec: torch.Tensor, dimensions: int | None) -> list[float]:
    return truncate(vec[None], dimensions)[0].cpu().tolist()


_PARAMS = SamplingParams(max_tokens=1)

"""Packs a scheduled step into tensors, runs the model once, returns the logits that are needed.

The runner never decides scheduling and never mutates queues: it reads each sequence's block
table and counters and returns logits for the last position of every sequence (and for every
prompt position of sequences that asked for prompt logprobs)."""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from mindie_service.engine.scheduler import SchedulerOutput
from mindie_service.engine.sequence import Sequence
from mindie_service.models.llama import StepContext
from npu_ops import memory
from npu_ops.ops import AttentionMetadata, PrefillSpan

logger = logging.getLogger(__name__)

# Tokens per forward piece of a large prefill (see ModelRunner._pieces).
PIECE_TOKENS = 1024


@dataclass
class StepResult:
    seqs: list[Sequence]  # decodes then prefills, the row order of ``logits``
    logits: torch.Tensor  # [len(seqs), vocab] at each sequence's last position
    prompt_logits: dict[str, torch.Tensor] = field(default_factory=dict)  # request_id -> [n-1, vocab]


def kv_bytes_per_block(model: nn.Module, block_size: int, dtype: torch.dtype) -> int:
    d = model.dims
    return 2 * d.layers * block_size * d.kv_heads * d.head_dim * torch.tensor([], dtype=dtype).element_size()


class ModelRunner:
    def __init__(self, model: nn.Module, num_blocks: int, block_size: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.model, self.block_size, self.device = model, block_size, device
        self.piece_tokens = PIECE_TOKENS
        d = model.dims
        # One allocation for every layer's K and V (huge pages on the CPU, see npu_ops.memory); zeros, not
        # empty: padded gathers read unused slots, and NaN bits there would poison masked scores.
        pool = memory.zeros((d.layers, 2, num_blocks, block_size, d.kv_heads, d.head_dim), dtype, device)
        self.kv_caches = [(pool[i, 0], pool[i, 1]) for i in range(d.layers)]
        # Hooks set by the LoRA and multimodal layers: (step seqs, packed token counts) -> context parts.
        self.lora_hook: Callable[[list[Sequence], list[int]], Any] | None = None
        self.embeds_hook: Callable[[list[tuple[Sequence, int, int]]], Any] | None = None

    def _slot(self, seq: Sequence, pos: int) -> int:
        return seq.block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> StepResult:
        """One forward over the step's tokens, run in pieces (``_pieces``) whose rows concatenate
        in ``sched.seqs`` order."""
        prompt_logits: dict[str, torch.Tensor] = {}
        parts = [self._forward(decodes, prefills, prompt_logits) for decodes, prefills in self._pieces(sched)]
        result = StepResult(sched.seqs, parts[0] if len(parts) == 1 else torch.cat(parts))
        result.prompt_logits = prompt_logits
        return result

    def _pieces(self, sched: SchedulerOutput) -> list[tuple[list[Sequence], list[Sequence]]]:
        """Split a large prefill into runs of whole sequences of about ``piece_tokens`` tokens: the
        activations of a piece stay in the CPU's cache, where the elementwise ops between the matmuls
        run several times faster than over one huge batch (and matmul speed is flat past ~256 rows)."""
        pieces: list[tuple[list[Sequence], list[Sequence]]] = [(sched.decodes, [])]
        tokens = len(sched.decodes)
        for seq in sched.prefills:
            n = seq.num_tokens - seq.num_computed_tokens
            if tokens and tokens + n > self.piece_tokens:
                pieces.append(([], []))
                tokens = 0
            pieces[-1][1].append(seq)
            tokens += n
        return pieces

    def _forward(self, decodes: list[Sequence], prefills: list[Sequence],
                 prompt_logits: dict[str, torch.Tensor]) -> torch.Tensor:
        dev = self.device
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        counts: list[int] = []
        for seq in decodes:
            pos = seq.num_tokens - 1
            ids.append(seq.token_at(pos))
            positions.append(pos)
            slots.append(self._slot(seq, pos))
            counts.append(1)
        spans: list[PrefillSpan] = []
        span_seqs: list[tuple[Sequence, int, int]] = []
        for seq in prefills:
            start, n = len(ids), seq.num_tokens - seq.num_computed_tokens
            first = seq.num_computed_tokens
            ids.extend(seq.token_ids()[first:])
            positions.extend(range(first, seq.num_tokens))
            slots.extend(self._slot(seq, p) for p in range(first, seq.num_tokens))
            ctx_slots = None
            if first > 0:
                ctx_slots = torch.tensor([self._slot(seq, p) for p in range(seq.num_tokens)], device=dev)
            spans.append(PrefillSpan(start, n, seq.num_tokens, ctx_slots))
            span_seqs.append((seq, start, first))
            counts.append(n)
        seqs = decodes + prefills
        max_blocks = max(len(s.block_table) for s in seqs)
        tables = torch.tensor([s.block_table + [0] * (max_blocks - len(s.block_table)) for s in seqs],
                              dtype=torch.int32, device=dev)
        pos_t = torch.tensor(positions, device=dev)
        meta = AttentionMetadata(slots=torch.tensor(slots, device=dev), num_decode=len(decodes), prefills=spans,
                                 block_tables=tables, row_pos=pos_t.to(torch.int32),
                                 row_seq=torch.tensor([i for i, n in enumerate(counts) for _ in range(n)],
                                                      dtype=torch.int32, device=dev))
        if decodes:
            meta.decode_block_tables = tables[:len(decodes)]
            meta.decode_ctx_lens = meta.row_pos[:len(decodes)] + 1  # a decode row sits at its last position
        step = StepContext(positions=pos_t, attn=meta)
        if self.lora_hook is not None:
            step.lora = self.lora_hook(seqs, counts)
        if self.embeds_hook is not None and span_seqs:
            step.embeds_override = self.embeds_hook(span_seqs)
        hidden = self.model(torch.tensor(ids, device=dev), step, self.kv_caches)
        # Last position of each sequence.
        ends = torch.tensor(list(itertools.accumulate(counts)), device=dev) - 1
        for seq, start, first in span_seqs:
            if seq.params.prompt_logprobs and first == 0 and not seq.output_token_ids:
                n = seq.num_tokens
                prompt_logits[seq.request_id] = self.model.compute_logits(hidden[start:start + n - 1])
        return self.model.compute_logits(hidden[ends])

"""Packs a scheduled step into tensors, runs the model once, returns the logits that are needed.

The runner never decides scheduling and never touches a sequence: it reads the step's plain
ScheduledChunks (tokens, positions, block tables) and returns the logits of the last row of every
chunk that samples (the last 1 + num_draft rows of a chunk verifying draft tokens: engine.spec.speculator),
and of every prompt row of chunks that asked for prompt logprobs; a multi-step decode (engine.sched.bursts)
returns its bursts' greedy tokens instead."""
from __future__ import annotations

import itertools
import logging
from dataclasses import replace
from typing import Any, Callable

import torch
from torch import nn

from mindie_service.engine.runner.cuda_graphs import DecodeGraphs, GraphPlan
from mindie_service.engine.step import ModelOutput, ScheduledChunk, SchedulerOutput
from mindie_service.models.fused_decode import FusedDecode
from mindie_service.models.gguf_packed import splits_step_kinds
from mindie_service.models.llama import StepContext
from npu_ops import memory, quant_kv
from npu_ops.gguf_modules import STEP_DECODE, STEP_PREFILL, gguf_step
from npu_ops.greedy import first_maxima
from npu_ops.ops import AttentionMetadata, PrefillSpan

logger = logging.getLogger(__name__)

# Tokens per forward piece of a large prefill (see ModelRunner._pieces).
PIECE_TOKENS = 1024

# The LoRA layer's hook: (adapter slots, token counts) of a forward's rows -> its applier (it first writes
# adapters newly given a pool slot). The multimodal encoder's: the prefill chunks holding media and their
# packed start -> (token indices, embeddings) spliced over the placeholders.
LoraHook = Callable[[list[int], list[int]], Any]
EmbedsHook = Callable[[list[tuple[ScheduledChunk, int]]], Any]


def kv_bytes_per_block(model: nn.Module, block_size: int, dtype: torch.dtype, kv_cache_dtype: str = "auto") -> int:
    d = model.dims
    if kv_cache_dtype == "int8":  # int8 rows with their fp32 scale (npu_ops.quant_kv)
        return 2 * d.layers * block_size * d.kv_heads * quant_kv.row_bytes(d.head_dim)
    return 2 * d.layers * block_size * d.kv_heads * d.head_dim * torch.tensor([], dtype=dtype).element_size()


class ModelRunner:
    def __init__(self, model: nn.Module, num_blocks: int, block_size: int, device: torch.device,
                 dtype: torch.dtype, lora_hook: LoraHook | None = None, embeds_hook: EmbedsHook | None = None,
                 host_blocks: int = 0, graphs: GraphPlan | None = None) -> None:
        self.model, self.block_size, self.device = model, block_size, device
        self._offsets = torch.arange(block_size, device=device)  # a block's slot offsets (prefix-cache spans)
        self.piece_tokens = PIECE_TOKENS
        # GGUF int8 activations in decode steps only (models/gguf_packed.py): a step's decode rows and its prompts'
        # rows run as separate pieces, each under its own step kind (gguf_step), so no row's numerics depend on
        # what else the step holds
        self.split_kinds = splits_step_kinds(model)
        d = model.dims
        # One allocation for every layer's K and V (huge pages on the CPU, see npu_ops.memory); zeros, not
        # empty: padded gathers read unused slots, and NaN bits there would poison masked scores.
        if getattr(model, "kv_cache_dtype", "auto") == "int8":  # each row: head_dim int8 + its fp32 scale
            self._pool_spec = ((d.layers, 2, num_blocks, block_size, d.kv_heads, quant_kv.row_bytes(d.head_dim)),
                               torch.int8)
        else:
            self._pool_spec = ((d.layers, 2, num_blocks, block_size, d.kv_heads, d.head_dim), dtype)
        self.host_blocks = host_blocks  # cpuMemSize's pool, in blocks (engine.kv.swap)
        self.host_pool: torch.Tensor | None = None  # [host_blocks, layers, 2, block_size, ...]: at the first swap
        self.lora_hook, self.embeds_hook = lora_hook, embeds_hook
        self._graph_plan = graphs  # CUDA graphs for plain decode steps (engine/runner/cuda_graphs.py; graph_plan)
        self.kv_pool: torch.Tensor | None = None
        self.alloc_pool()

    def alloc_pool(self) -> None:
        """The KV pool (at start, and on waking from a level-1 sleep), its per-layer views, and the fused decoder
        and the decode graphs over them (graphs are captured again on first use)."""
        shape, dtype = self._pool_spec
        pool = memory.zeros(shape, dtype, self.device)
        self.kv_caches = [(pool[i, 0], pool[i, 1]) for i in range(shape[0])]
        self.kv_pool = pool
        self.fused = FusedDecode(self.model, self.kv_caches) if self.device.type == "cpu" else None
        plan = self._graph_plan
        self.graphs = DecodeGraphs(self.model, self.kv_caches, self.device, plan) if plan is not None else None

    def release_pool(self) -> int:
        """Level-1 sleep: every reference to the KV pool (views, the fused decoder's table, the swap pool) dropped,
        so its memory goes back; the bytes it held. ``alloc_pool`` makes a fresh one."""
        freed = self.kv_pool_bytes
        self.kv_caches, self.kv_pool, self.fused, self.host_pool, self.graphs = [], None, None, None, None
        return freed

    def idle(self) -> None:
        """The engine ran out of work: the fused layers' work buffer (sized by the largest step, a prefill of many
        prompts: ~30 MB on SmolLM2 at 32 streams) dropped and the C heap's free pages given back, so a run's peak
        does not stay in the RSS (issue 44). The next step allocates again (one buffer, well under a step's time)."""
        fused = getattr(self.model, "_fused_layers", None)
        if fused is not None:
            fused.release()
        memory.trim_heap()

    @property
    def kv_pool_bytes(self) -> int:
        return 0 if self.kv_pool is None else self.kv_pool.numel() * self.kv_pool.element_size()

    def _slot(self, table: tuple[int, ...], pos: int) -> int:
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    @torch.inference_mode()
    def apply_swaps(self, out: SchedulerOutput) -> None:
        """The step's KV block copies (engine.kv.swap), before its forward: swap-outs first, since a device
        block saved here may be the one a swap-in or this step's tokens write next. Blocking copies: the
        host blocks are read or reused as soon as this returns."""
        if out.swap_out:
            if self.host_pool is None:
                self.host_pool = self._alloc_host_pool()
            dev = torch.tensor([d for d, _ in out.swap_out], device=self.device)
            host = torch.tensor([h for _, h in out.swap_out])
            self.host_pool.index_copy_(0, host, self.kv_pool.index_select(2, dev).movedim(2, 0).cpu())
        if out.swap_in:
            assert self.host_pool is not None, "swap-in before any swap-out"
            dev = torch.tensor([d for _, d in out.swap_in], device=self.device)
            host = torch.tensor([h for h, _ in out.swap_in])
            blocks = self.host_pool.index_select(0, host).movedim(0, 2).to(self.device)
            self.kv_pool.index_copy_(2, dev, blocks)

    def _alloc_host_pool(self) -> torch.Tensor:
        p = self.kv_pool
        shape = (self.host_blocks, p.shape[0], p.shape[1], *p.shape[3:])
        logger.info("KV swap pool: %d host blocks (%.2f GB)", self.host_blocks,
                    self.host_blocks * p[:, :, 0].numel() * p.element_size() / 2 ** 30)
        if p.device.type != "cpu":
            try:  # pinned: faster copies to and from the accelerator
                return torch.empty(shape, dtype=p.dtype, pin_memory=True)
            except RuntimeError:
                logger.info("pinned host memory unavailable: the swap pool is pageable")
        return torch.empty(shape, dtype=p.dtype)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> ModelOutput:
        """The step's swaps (``apply_swaps``), then one forward over its chunks, run in pieces (``_pieces``);
        the logits of the sampling rows concatenate in ``out.chunks`` order."""
        self.apply_swaps(out)
        if out.decodes and out.decodes[0].steps > 1:  # engine.sched.bursts: a step of plain decodes only
            return self._burst(out.decodes, out.decodes[0].steps)
        prompt_logits: dict[str, torch.Tensor] = {}
        parts = [self._piece(decodes, prefills, prompt_logits) for decodes, prefills in self._pieces(out)]
        parts = [p for p in parts if p is not None]
        if not parts:
            logits = torch.empty(0, self.model.dims.vocab, device=self.device)
        else:
            logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        return ModelOutput(logits, prompt_logits)

    def _pieces(self, out: SchedulerOutput) -> list[tuple[list[ScheduledChunk], list[ScheduledChunk]]]:
        """Split a large prefill into runs of whole chunks of about ``piece_tokens`` tokens: the
        activations of a piece stay in the CPU's cache, where the elementwise ops between the matmuls
        run several times faster than over one huge batch (and matmul speed is flat past ~256 rows)."""
        pieces: list[tuple[list[ScheduledChunk], list[ScheduledChunk]]] = [(out.decodes, [])]
        tokens = out.num_decodes
        for c in out.prefills:  # verify chunks (decode kind) first, then prompt chunks (scheduler's order)
            n = c.num_tokens
            new_kind = self.split_kinds and not c.num_draft and _decode_kind(pieces[-1][1])
            if tokens and (tokens + n > self.piece_tokens or new_kind):
                pieces.append(([], []))
                tokens = 0
            pieces[-1][1].append(c)
            tokens += n
        return pieces

    def _piece(self, decodes: list[ScheduledChunk], prefills: list[ScheduledChunk],
               prompt_logits: dict[str, torch.Tensor]) -> torch.Tensor | None:
        fused = None if prefills else self._fused_decode(decodes)
        if fused is not None:
            return fused
        with gguf_step(STEP_DECODE if _decode_kind(prefills) else STEP_PREFILL):
            return self._forward(decodes, prefills, prompt_logits)

    def _fused_decode(self, decodes: list[ScheduledChunk]) -> torch.Tensor | None:
        """A step of plain decodes in one call: the CPU's C step (models/fused_decode.py) or a CUDA graph's replay;
        None where neither applies (LoRA rows, drafts, a batch or a context no graph bucket holds)."""
        if not decodes or not all(c.sample and not c.num_draft and not c.adapter_slot for c in decodes):
            return None
        if self.graphs is not None and self.graphs.takes(len(decodes), max(len(c.block_table) for c in decodes)):
            return self.graphs.run([c.token_ids[0] for c in decodes], [c.start for c in decodes],
                                   [self._slot(c.block_table, c.start) for c in decodes],
                                   [c.block_table for c in decodes])
        if self.fused is None or not self.fused.usable(len(decodes)):
            return None
        return self.fused.run([c.token_ids[0] for c in decodes], [c.start for c in decodes],
                              [self._slot(c.block_table, c.start) for c in decodes], [c.block_table for c in decodes])

    def _burst(self, decodes: list[ScheduledChunk], steps: int) -> ModelOutput:
        """``steps`` greedy decode steps of every chunk (engine.sched.bursts): the fused C step where it applies,
        else a forward a step. Where step 0's logits are not all finite they go back as a plain step's, for the
        sampler to name the bad rows; a later such step ends the burst before it."""
        if self.fused is not None and self.fused.usable(len(decodes)):
            slots = [[self._slot(c.block_table, c.start + s) for c in decodes] for s in range(steps)]
            got = self.fused.run_steps([c.token_ids[0] for c in decodes], [c.start for c in decodes], slots,
                                       [c.block_table for c in decodes])
        else:
            got = self._steps_by_forward(decodes, steps)
        if isinstance(got, torch.Tensor):
            return ModelOutput(got)
        return ModelOutput(torch.empty(0, self.model.dims.vocab, device=self.device), tokens=got[0],
                           token_logprobs=got[1])

    def _steps_by_forward(self, decodes: list[ScheduledChunk],
                          steps: int) -> tuple[list[list[int]], list[list[float]]] | torch.Tensor:
        toks: list[list[int]] = [[] for _ in decodes]
        lps: list[list[float]] = [[] for _ in decodes]
        current = [c.token_ids[0] for c in decodes]
        for s in range(steps):
            rows = [replace(c, start=c.start + s, token_ids=(t,), steps=1) for c, t in zip(decodes, current)]
            logits = self._piece(rows, [], {})  # a CUDA graph's replay where one applies
            assert logits is not None
            got = first_maxima(logits)
            if got is None:
                return logits if s == 0 else (toks, lps)
            current = got[0]
            for r, (tid, lp) in enumerate(zip(*got)):
                toks[r].append(tid)
                lps[r].append(lp)
        return toks, lps

    @torch.inference_mode()
    def prefill_hidden(self, prefills: list[ScheduledChunk]) -> torch.Tensor:
        """The final hidden states [sum of tokens, hidden] (after the final norm) of whole-prompt chunks that
        sample nothing: a pooling batch (engine.pooling). Their K/V are written into their blocks as any prefill's;
        the caller frees the blocks after."""
        ids, step, _ = self._pack([], prefills)
        with gguf_step(STEP_PREFILL):
            return self.model(ids, step, self.kv_caches)

    def _forward(self, decodes: list[ScheduledChunk], prefills: list[ScheduledChunk],
                 prompt_logits: dict[str, torch.Tensor]) -> torch.Tensor | None:
        ids, step, starts = self._pack(decodes, prefills)
        hidden = self.model(ids, step, self.kv_caches)
        for c, start in zip(prefills, starts):
            if c.prompt_logprobs:  # every row that predicts a prompt token (the sampling row does not)
                rows = c.num_tokens - 1 if c.sample else c.num_tokens
                prompt_logits[c.request_id] = self.model.compute_logits(hidden[start:start + rows])
        # Last row of each chunk that samples; a chunk verifying drafts: its last 1 + num_draft rows.
        counts = [1] * len(decodes) + [c.num_tokens for c in prefills]
        ends = [r for c, e in zip(decodes + prefills, itertools.accumulate(counts)) if c.sample
                for r in range(e - 1 - c.num_draft, e)]
        if not ends:
            return None
        return self.model.compute_logits(hidden[torch.tensor(ends, device=self.device)])

    def _pack(self, decodes: list[ScheduledChunk],
              prefills: list[ScheduledChunk]) -> tuple[torch.Tensor, StepContext, list[int]]:
        """A forward's input ids, its StepContext and each prefill chunk's first row."""
        dev = self.device
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        counts: list[int] = []
        for c in decodes:
            ids.append(c.token_ids[0])
            positions.append(c.start)
            slots.append(self._slot(c.block_table, c.start))
            counts.append(1)
        spans: list[PrefillSpan] = []
        starts: list[int] = []
        for c in prefills:
            start, n, first, end = len(ids), c.num_tokens, c.start, c.end
            ids.extend(c.token_ids)
            positions.extend(range(first, end))
            slots.extend(self._slot(c.block_table, p) for p in range(first, end))
            ctx_slots = None
            if first > 0:  # every context position's slot, block by block (no Python loop over positions)
                blocks = torch.tensor(c.block_table[:(end + self.block_size - 1) // self.block_size], device=dev)
                ctx_slots = (blocks[:, None] * self.block_size + self._offsets).reshape(-1)[:end]
            spans.append(PrefillSpan(start, n, end, ctx_slots, len(decodes) + len(spans)))  # its block_tables row
            starts.append(start)
            counts.append(n)
        chunks = decodes + prefills
        max_blocks = max(len(c.block_table) for c in chunks)
        tables = torch.tensor([c.block_table + (0,) * (max_blocks - len(c.block_table)) for c in chunks],
                              dtype=torch.int32, device=dev)
        pos_t = torch.tensor(positions, device=dev)
        meta = AttentionMetadata(slots=torch.tensor(slots, device=dev), num_decode=len(decodes), prefills=spans,
                                 block_tables=tables, row_pos=pos_t.to(torch.int32),
                                 row_seq=torch.tensor([i for i, n in enumerate(counts) for _ in range(n)],
                                                      dtype=torch.int32, device=dev))
        if decodes:
            meta.decode_block_tables = tables[:len(decodes)]
            meta.decode_ctx_lens = meta.row_pos[:len(decodes)] + 1  # a decode row sits at its last position
            # ATB's paged attention reads the lengths on the host: built from Python ints, no device sync.
            meta.decode_ctx_lens_host = torch.tensor([c.start + 1 for c in decodes], dtype=torch.int32)
        step = StepContext(positions=pos_t, attn=meta)
        if self.lora_hook is not None:
            step.lora = self.lora_hook([c.adapter_slot for c in chunks], counts)
        if self.embeds_hook is not None:
            media = [(c, s) for c, s in zip(prefills, starts) if c.mm_inputs is not None]
            if media:
                step.embeds_override = self.embeds_hook(media)
        return torch.tensor(ids, device=dev), step, starts


def _decode_kind(prefills: list[ScheduledChunk]) -> bool:
    """Whether a piece whose prefill chunks are ``prefills`` is a decode step: each row a sequence's next token
    (its plain decodes, speculation's verify chunks), no prompt's rows."""
    return all(c.num_draft for c in prefills)

"""The draft-model proposer: a smaller checkpoint with the target's tokenizer, run by the engine's own
model code and runner over its own paged KV pool (no prefix cache), proposes each row's next tokens.

Each sequence has a shadow here: a Sequence whose token list is what the draft's K/V holds. Per step the
shadow first catches up with the sequence's accepted tokens (after a verify only the drafts the target
kept stay valid: the shadow's computed count is cut back to where the two lists agree), giving draft 1;
then one batched single-token forward per further draft. Drafts are the draft model's argmax (one-hot
proposals: the verify's acceptance stays exact under sampling, engine.speculative). A row whose shadow
finds no blocks drafts nothing this step; shadows of sequences no longer running are dropped."""
from __future__ import annotations

import logging
import time
from typing import Any

import torch

from mindie_service.engine.block_manager import BlockManager
from mindie_service.engine.model_runner import ModelRunner
from mindie_service.engine.sequence import Sequence
from mindie_service.engine.step import ScheduledChunk, SchedulerOutput
from mindie_service.errors import ValidationError
from mindie_service.models.loader import load_model

logger = logging.getLogger(__name__)


class DraftModelProposer:
    def __init__(self, path: str, dtype: str, device: torch.device, max_seq_len: int, batch_hint: int,
                 num_blocks: int, block_size: int, target_vocab: int, target_tokenizer: Any) -> None:
        loaded = load_model(path, dtype, device, max_seq_len, batch_hint)
        vocab = int(loaded.model.dims.vocab)
        if vocab != target_vocab:
            raise ValidationError(f"speculative draft model {path}: vocabulary of {vocab} tokens, the target has "
                                  f"{target_vocab}; a draft model must share the target's tokenizer")
        _check_tokenizer(path, target_tokenizer)
        self.runner = ModelRunner(loaded.model, num_blocks, block_size, device, loaded.dtype)
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        self.shadows: dict[str, Sequence] = {}
        self.last_seconds = 0.0  # the last propose()'s wall time (the cost model's draft share)
        logger.info("speculative draft model %s: %d layers, KV pool of %d blocks", path, loaded.model.dims.layers,
                    num_blocks)

    def forget(self, request_id: str) -> None:
        shadow = self.shadows.pop(request_id, None)
        if shadow is not None:
            self.blocks.free_seq(shadow)

    def propose(self, wants: list[tuple[Sequence, int]], running: set[str]) -> dict[str, list[int]]:
        """Drafts for each (sequence, k > 0) of ``wants``; ``running``: the ids whose shadows are kept."""
        t0 = time.perf_counter()
        for rid in [r for r in self.shadows if r not in running]:
            self.forget(rid)
        rows: list[tuple[Sequence, int, list[int]]] = []  # (shadow, k, drafts so far)
        for seq, k in wants:
            shadow = self._sync(seq, k)
            if shadow is not None:
                rows.append((shadow, k, []))
        if rows:
            first = [self._catch_up_chunk(s) for s, _, _ in rows]
            self._draft(rows, first)
            for i in range(1, max(k for _, k, _ in rows)):
                live = [r for r in rows if len(r[2]) == i and r[1] > i]
                if not live:
                    break
                self._draft(live, [self._next_chunk(s, d) for s, _, d in live])
        for shadow, _, drafts in rows:  # the draft's K/V now holds the tokens and every draft but the last
            shadow.prompt_token_ids.extend(drafts[:-1])
            shadow.num_computed_tokens = shadow.num_tokens
        self.last_seconds = time.perf_counter() - t0
        return {s.request_id: d for s, _, d in rows}

    def _sync(self, seq: Sequence, k: int) -> Sequence | None:
        tokens = seq.token_ids()
        shadow = self.shadows.get(seq.request_id)
        if shadow is None:
            shadow = Sequence(seq.request_id, [], seq.params, 0, 0)
            self.shadows[seq.request_id] = shadow
        # The sequence's tokens only grow: those it had at the last sync still agree (num_cached_tokens holds
        # their count); past them, the drafts the target accepted agree too, up to the first it rejected.
        old, same = shadow.prompt_token_ids, min(shadow.num_cached_tokens, shadow.num_computed_tokens)
        while same < shadow.num_computed_tokens and same < len(tokens) and old[same] == tokens[same]:
            same += 1
        shadow.prompt_token_ids = tokens
        shadow.num_cached_tokens = len(tokens)
        shadow.num_computed_tokens = min(same, len(tokens) - 1)
        if not self.blocks.ensure_slots(shadow, len(tokens) + k - 1):
            self.forget(seq.request_id)
            return None
        return shadow

    @staticmethod
    def _catch_up_chunk(s: Sequence) -> ScheduledChunk:
        start = s.num_computed_tokens
        return ScheduledChunk(s.request_id, start, tuple(s.prompt_token_ids[start:]), tuple(s.block_table), True)

    @staticmethod
    def _next_chunk(s: Sequence, drafts: list[int]) -> ScheduledChunk:
        pos = s.num_tokens - 1 + len(drafts)
        return ScheduledChunk(s.request_id, pos, (drafts[-1],), tuple(s.block_table), True)

    def _draft(self, rows: list[tuple[Sequence, int, list[int]]], chunks: list[ScheduledChunk]) -> None:
        """One draft forward: single-token chunks as decodes first, then the catch-up chunks."""
        order = sorted(range(len(chunks)), key=lambda i: chunks[i].num_tokens > 1)
        ordered = [chunks[i] for i in order]
        out = SchedulerOutput(ordered, sum(1 for c in ordered if c.num_tokens == 1))
        logits = self.runner.execute(out).logits
        best = logits.argmax(-1).tolist()
        for row, i in enumerate(order):
            rows[i][2].append(int(best[row]))


def _check_tokenizer(path: str, target_tokenizer: Any) -> None:
    from transformers import AutoTokenizer

    draft = AutoTokenizer.from_pretrained(path)
    if draft.get_vocab() != target_tokenizer.get_vocab():
        raise ValidationError(f"speculative draft model {path}: its tokenizer differs from the target's; a draft "
                              f"model must share the target's tokenizer")

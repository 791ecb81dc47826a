"""The draft-model proposer: a smaller checkpoint with the target's tokenizer, run by the engine's own
model code and runner over its own paged KV pool (no prefix cache), proposes each row's next tokens.

Each sequence has a shadow here: a Sequence whose token list is what the draft's K/V holds. Per step the
shadow first catches up with the sequence's accepted tokens (after a verify only the drafts the target
kept stay valid: the shadow's computed count is cut back to where the two lists agree), giving draft 1;
then one batched single-token forward per further draft. A greedy request's drafts are the draft model's
argmax (one-hot: the verify draws the target's token and accepts on equality). A sampled request's drafts
are drawn from the draft's own distribution q (the request's temperature, top-k, top-p and typical-p over the
draft's logits; penalties are the target's alone) with a generator of the shadow's own, seeded from the
request's seed; q is kept per draft position (``dists_for``) and the verify rejection-samples against it
(engine.sample.spec_accept). A row whose shadow finds no blocks drafts nothing this step; shadows of sequences no
longer running are dropped.

The draft's KV pool has as many blocks as the target's; it is counted in the KV memory budget
(engine.runner.engine_parts.auto_num_blocks, with ``kv_bytes_per_draft_block``): the target's pool shrinks by it."""
from __future__ import annotations

import logging
from typing import Any

import torch

from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.runner.model_runner import ModelRunner, kv_bytes_per_block
from mindie_service.engine.sample.sampler import Sampler
from mindie_service.engine.sequence import Sequence
from mindie_service.engine.step import ScheduledChunk, SchedulerOutput
from mindie_service.errors import ValidationError
from mindie_service.models.loader import DTYPES, checkpoint_config, load_model, release_checkpoint
from npu_ops.platform import default_dtype

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
        release_checkpoint(path)  # a GGUF draft's parse out of the RSS, as the target's (issue 44)
        self.runner = ModelRunner(loaded.model, num_blocks, block_size, device, loaded.dtype)
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        self.shadows: dict[str, Sequence] = {}
        self.generators: dict[str, torch.Generator] = {}  # sampled requests' draft draws, seeded per request
        self.dists: dict[str, tuple[list[int], torch.Tensor]] = {}  # this step's sampled drafts and their q
        self.block_bytes = kv_bytes_per_block(loaded.model, block_size, loaded.dtype)
        logger.info("speculative draft model %s: %d layers, KV pool of %d blocks (%.1f MiB)", path,
                    loaded.model.dims.layers, num_blocks, num_blocks * self.block_bytes / 2**20)

    def forget(self, request_id: str) -> None:
        shadow = self.shadows.pop(request_id, None)
        if shadow is not None:
            self.blocks.free_seq(shadow)
        self.generators.pop(request_id, None)

    def propose(self, wants: list[tuple[Sequence, int]], running: set[str]) -> dict[str, list[int]]:
        """Drafts for each (sequence, k > 0) of ``wants``; ``running``: the ids whose shadows are kept."""
        self.dists = {}
        for rid in [r for r in self.shadows if r not in running]:
            self.forget(rid)
        rows: list[tuple[Sequence, int, list[int]]] = []  # (shadow, k, drafts so far)
        qs: dict[str, list[torch.Tensor]] = {}  # sampled rows: q of each draft so far
        for seq, k in wants:
            shadow = self._sync(seq, k)
            if shadow is not None:
                rows.append((shadow, k, []))
        if rows:
            first = [self._catch_up_chunk(s) for s, _, _ in rows]
            self._draft(rows, first, qs)
            for i in range(1, max(k for _, k, _ in rows)):
                live = [r for r in rows if len(r[2]) == i and r[1] > i]
                if not live:
                    break
                self._draft(live, [self._next_chunk(s, d) for s, _, d in live], qs)
        for shadow, _, drafts in rows:  # the draft's K/V now holds the tokens and every draft but the last
            shadow.prompt_token_ids.extend(drafts[:-1])
            shadow.num_computed_tokens = shadow.num_tokens
            if shadow.request_id in qs:
                self.dists[shadow.request_id] = (list(drafts), torch.stack(qs[shadow.request_id]))
        return {s.request_id: d for s, _, d in rows}

    def _sync(self, seq: Sequence, k: int) -> Sequence | None:
        tokens = seq.token_ids()
        shadow = self.shadows.get(seq.request_id)
        if shadow is None:
            shadow = Sequence(seq.request_id, [], seq.params, 0, seq.seed)
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

    def _draft(self, rows: list[tuple[Sequence, int, list[int]]], chunks: list[ScheduledChunk],
               qs: dict[str, list[torch.Tensor]]) -> None:
        """One draft forward: single-token chunks as decodes first, then the catch-up chunks. Greedy rows take
        the argmax; sampled rows draw from q, kept in ``qs``."""
        order = sorted(range(len(chunks)), key=lambda i: chunks[i].num_tokens > 1)
        ordered = [chunks[i] for i in order]
        out = SchedulerOutput(ordered, sum(1 for c in ordered if c.num_tokens == 1))
        logits = self.runner.execute(out).logits
        best = logits.argmax(-1).tolist()
        shadows = [rows[i][0] for i in order]
        sampled = [row for row, s in enumerate(shadows) if not s.params.greedy]
        if sampled:
            probs = Sampler._warp(logits[torch.tensor(sampled, device=logits.device)].double(),
                                 [shadows[row] for row in sampled])
            for j, row in enumerate(sampled):
                q = probs[j]
                if bool(q.isfinite().all()) and float(q.sum()) > 0.0:
                    best[row] = int(torch.multinomial(q, 1, generator=self._generator(shadows[row]))[0])
                else:  # no distribution: the argmax, as a one-hot q (the verify's rule is then draw-and-compare)
                    q = torch.zeros_like(q)
                    q[best[row]] = 1.0
                qs.setdefault(shadows[row].request_id, []).append(q)
        for row, i in enumerate(order):
            rows[i][2].append(int(best[row]))

    def _generator(self, shadow: Sequence) -> torch.Generator:
        g = self.generators.get(shadow.request_id)
        if g is None:
            g = torch.Generator(device=self.runner.device)
            g.manual_seed((shadow.seed * 0x9E3779B97F4A7C15 + 0x5EED) % (2**63))  # apart from the target's stream
            self.generators[shadow.request_id] = g
        return g

    def dists_for(self, request_id: str, drafts: tuple[int, ...]) -> torch.Tensor | None:
        """q of each draft of ``drafts`` (the verify's, a prefix of this step's proposal), one row per draft;
        None for a greedy request's (one-hot) drafts, or drafts this step did not propose as sampled."""
        got = self.dists.get(request_id)
        if got is None or len(got[1]) < len(drafts) or tuple(got[0][:len(drafts)]) != drafts:
            return None
        return got[1][:len(drafts)]


def kv_bytes_per_draft_block(path: str, dtype: str, device: torch.device, block_size: int) -> int:
    """Bytes of one block of the draft model's KV pool (K and V, every layer, in the dtype it is loaded in),
    from its config alone: the engine sizes the target's pool with the draft's share taken out of the budget
    before the draft is loaded (engine.runner.engine_parts.auto_num_blocks)."""
    cfg, ckpt_dtype = checkpoint_config(path)
    heads = int(cfg.num_attention_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    name = default_dtype(device, ckpt_dtype) if dtype == "auto" else dtype
    return 2 * int(cfg.num_hidden_layers) * block_size * kv_heads * head_dim * DTYPES[name].itemsize


def _check_tokenizer(path: str, target_tokenizer: Any) -> None:
    from transformers import AutoTokenizer

    draft = AutoTokenizer.from_pretrained(path)
    if draft.get_vocab() != target_tokenizer.get_vocab():
        raise ValidationError(f"speculative draft model {path}: its tokenizer differs from the target's; a draft "
                              f"model must share the target's tokenizer")

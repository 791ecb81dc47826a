"""A fixed pool of KV blocks with per-sequence block tables and a reference-counted prefix cache.

A full block's key is a hash chain over (previous block's key, its tokens, the sequence's cache
key): the cache key carries the LoRA adapter identity and the media content hashes, so two
requests share a block only when everything that produced its K/V is the same. Freed blocks keep
their key and stay reusable until the LRU hands them out again.

Reservations (maxPreemptCount = 0, no preemption): an owner (a sequence, or a beam group for all its
beams) admitted with a budget of blocks is promised the blocks it does not hold yet; ``reserved`` is
the sum of those promises and no one else may take them, so a reserving owner never lacks a block.
An owner's promise is its budget minus the distinct blocks its members hold, refreshed whenever one
of them gains or drops blocks."""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from mindie_service.engine.kv.kv_event_types import BlockEventSink
from mindie_service.engine.sequence import Sequence, SequenceGroup
from mindie_service.sampling_params import is_base_adapter


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))  # LRU order
        self.cached: dict[bytes, int] = {}
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.reserved = 0  # free blocks promised to reserving owners (see the module docstring)
        self._budget: dict[Sequence | SequenceGroup, int] = {}  # owner -> blocks it may hold in all
        self._members: dict[Sequence | SequenceGroup, list[Sequence]] = {}  # owner -> its sequences holding blocks
        self._promised: dict[Sequence | SequenceGroup, int] = {}  # owner -> blocks promised, not yet taken
        self.events: BlockEventSink | None = None  # told of hashes entering / leaving the cache (kv_event_types)

    # ------------------------------------------------------------ queries
    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def num_available_blocks(self) -> int:
        """Free blocks nobody was promised."""
        return len(self.free) - self.reserved

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_blocks

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_key(self, parent: bytes, tokens: list[int], key: bytes = b"") -> bytes:
        """The prefix cache's key of a full block: its parent's key (b"" for the first), its tokens and the
        sequence's cache key (adapter, media; b"" for the base model's text)."""
        h = hashlib.sha256(parent)
        h.update(array("q", tokens).tobytes())
        h.update(key)
        return h.digest()

    def _full_block_hashes(self, seq: Sequence, upto: int) -> list[bytes]:
        """Hash chain of the first ``upto // block_size`` full blocks (extends seq.block_hashes)."""
        bs = self.block_size
        hashes = seq.block_hashes
        tokens = None
        while len(hashes) < upto // bs:
            tokens = tokens or seq.token_ids()
            i = len(hashes)
            hashes.append(self.block_key(hashes[-1] if hashes else b"", tokens[i * bs:(i + 1) * bs], seq.cache_key))
        return hashes[:upto // bs]

    # ------------------------------------------------------------ allocation
    def _take_free(self) -> int:
        block, _ = self.free.popitem(last=False)
        old = self.block_hash[block]
        if old is not None and self.cached.get(old) == block:
            del self.cached[old]
            if self.events is not None:
                self.events.removed([old])
        self.block_hash[block] = None
        self.ref_counts[block] = 1
        return block

    def _hits_then_free(self, hits: list[int], new_needed: int) -> list[int]:
        """A block table: the prefix-cache hits (one more reference each) followed by ``new_needed`` free blocks."""
        for b in hits:
            self.pin(b)
        return hits + [self._take_free() for _ in range(new_needed)]

    def allocate(self, seq: Sequence, use_prefix_cache: bool = True, reserve: int = 0) -> bool:
        """Give a waiting sequence blocks for all its tokens (prompt, plus output when recomputing); with
        ``reserve`` > 0 its owner (see ``owner``) is also promised blocks up to that many in all.

        Returns False, changing nothing, when the pool lacks room. At least one token is always
        left to compute so the step yields logits."""
        hits, new_needed = self._plan(seq, use_prefix_cache)
        if not self._fits(seq, hits, new_needed, reserve):
            return False
        seq.block_table = self._hits_then_free(hits, new_needed)
        seq.num_cached_tokens = seq.num_computed_tokens = len(hits) * self.block_size
        seq.num_registered_blocks = len(hits)
        self._join(seq, reserve)
        if self.enable_prefix_caching and use_prefix_cache:
            self.prefix_queries += 1
            self.prefix_hits += 1 if hits else 0
        return True

    def can_allocate(self, seq: Sequence, use_prefix_cache: bool = True, reserve: int = 0) -> bool:
        """Whether ``allocate`` would succeed now, prefix-cache hits counted; changes nothing."""
        hits, new_needed = self._plan(seq, use_prefix_cache)
        return self._fits(seq, hits, new_needed, reserve)

    def _plan(self, seq: Sequence, use_prefix_cache: bool) -> tuple[list[int], int]:
        """The cached blocks a waiting sequence's leading full blocks would take, and how many new ones it needs."""
        n = seq.num_tokens
        hits: list[int] = []
        if self.enable_prefix_caching and use_prefix_cache:
            for h in self._full_block_hashes(seq, n - 1):
                b = self.cached.get(h)
                if b is None:
                    break
                hits.append(b)
        return hits, self.blocks_needed(n) - len(hits)

    def _fits(self, seq: Sequence, hits: list[int], new_needed: int, reserve: int) -> bool:
        reusable_free_hits = sum(1 for b in hits if self.ref_counts[b] == 0)
        promise = max(0, reserve - len(hits) - new_needed)
        return new_needed + promise <= self._available_to(seq) - reusable_free_hits

    def allocate_resumed(self, seq: Sequence, num_blocks: int, reserve: int = 0) -> int | None:
        """``num_blocks`` blocks for a swapped-out sequence coming back: its leading full blocks still in the
        prefix cache (same hash chain: the very K/V) are taken as they are, the rest are new (its K/V is
        copied into them from the host). Returns how many came from the cache; None, changing nothing,
        when the pool lacks room."""
        hits: list[int] = []
        if self.enable_prefix_caching:
            for h in seq.block_hashes[:num_blocks]:  # hashes of computed full blocks only
                b = self.cached.get(h)
                if b is None:
                    break
                hits.append(b)
        new_needed = num_blocks - len(hits)
        reusable_free_hits = sum(1 for b in hits if self.ref_counts[b] == 0)
        if new_needed + max(0, reserve - num_blocks) > self._available_to(seq) - reusable_free_hits:
            return None
        seq.block_table = self._hits_then_free(hits, new_needed)
        seq.num_registered_blocks = len(hits)
        self._join(seq, reserve)
        return len(hits)

    def can_append(self, seq: Sequence) -> bool:
        """Whether the next token (at position num_tokens - 1 ... written this step) has a slot."""
        return len(seq.block_table) * self.block_size >= seq.num_tokens or (
            len(self.free) > 0 and self._available_to(seq) > 0)

    def append_slot(self, seq: Sequence) -> None:
        if len(seq.block_table) * self.block_size < seq.num_tokens:
            seq.block_table.append(self._take_free())
            self._refresh(owner(seq))

    def extra_slots(self, seq: Sequence, n: int) -> int:
        """Slots for up to ``n`` draft tokens after the next one (engine.spec.speculator), best effort and never
        at anyone's expense: only blocks nobody was promised (or ``seq``'s owner's own promise). Returns
        how many it got; ``trim`` gives back what the verify did not keep."""
        got = 0
        while got < n:
            need = seq.num_tokens + got + 1  # positions 0 .. num_tokens + got written this step
            if len(seq.block_table) * self.block_size < need:
                if not self.free or self._available_to(seq) <= 0:
                    break
                seq.block_table.append(self._take_free())
            got += 1
        if got:
            self._refresh(owner(seq))
        return got

    def ensure_slots(self, seq: Sequence, num_tokens: int) -> bool:
        """Grow ``seq``'s block table to hold ``num_tokens`` positions (the draft model's own pool, which
        keeps no prefix cache); False when the pool runs dry (what was taken stays)."""
        while len(seq.block_table) * self.block_size < num_tokens:
            if not self.free or self._available_to(seq) <= 0:
                return False
            seq.block_table.append(self._take_free())
        return True

    def slots_for(self, seq: Sequence, num_tokens: int) -> bool:
        """``ensure_slots`` for a sequence of this pool's scheduler (a token a grammar forces): its owner's
        promise is refreshed as for any slot it takes."""
        had = len(seq.block_table)
        ok = self.ensure_slots(seq, num_tokens)
        if len(seq.block_table) != had:
            self._refresh(owner(seq))
        return ok

    def trim(self, seq: Sequence) -> None:
        """Free the tail blocks past the one holding ``seq``'s next position (rejected drafts' slots). Their
        K/V was never registered (register_computed stops at num_computed_tokens), so no block holding a
        rejected token can enter the prefix cache; a freed block keeps no hash."""
        keep = max(self.blocks_needed(seq.num_tokens), seq.num_registered_blocks)
        if len(seq.block_table) <= keep:
            return
        for b in reversed(seq.block_table[keep:]):
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free[b] = None
                self.free.move_to_end(b, last=False)  # holds nothing reusable: handed out first
        del seq.block_table[keep:]
        self._refresh(owner(seq))

    def register_computed(self, seq: Sequence) -> None:
        """Enter the sequence's newly completed blocks (K/V computed) into the prefix cache."""
        if not self.enable_prefix_caching:
            return
        full = seq.num_computed_tokens // self.block_size
        if full <= seq.num_registered_blocks:
            return
        hashes = self._full_block_hashes(seq, full * self.block_size)
        stored: list[int] = []
        for i in range(seq.num_registered_blocks, full):
            b, h = seq.block_table[i], hashes[i]
            if h not in self.cached:
                self.cached[h] = b
                self.block_hash[b] = h
                stored.append(i)
        seq.num_registered_blocks = full
        if self.events is not None and stored:
            self._report_stored(seq, hashes, stored)

    def _report_stored(self, seq: Sequence, hashes: list[bytes], stored: list[int]) -> None:
        """One ``stored`` event per run of consecutive newly cached blocks of ``seq``."""
        assert self.events is not None
        bs, tokens = self.block_size, seq.token_ids()
        lora = None if is_base_adapter(seq.params.adapter_id) else seq.params.adapter_id
        start = 0
        for k in range(1, len(stored) + 1):
            if k < len(stored) and stored[k] == stored[k - 1] + 1:
                continue
            lo, hi = stored[start], stored[k - 1] + 1
            self.events.stored(hashes[lo:hi], hashes[lo - 1] if lo else None, tokens[lo * bs:hi * bs], lora)
            start = k

    def fork(self, parent: Sequence, child: Sequence) -> bool:
        """Copy-on-write for beams: ``child`` (the parent's tokens plus one) shares the parent's full blocks and
        gets fresh blocks from the partly filled one on, whose tokens it recomputes; the parent keeps writing
        its own. False, changing nothing, when the pool lacks the fresh blocks."""
        full = parent.num_computed_tokens // self.block_size
        need = self.blocks_needed(child.num_tokens) - full
        if need > self._available_to(child):
            return False
        shared = parent.block_table[:full]
        for b in shared:
            self.ref_counts[b] += 1
        child.block_table = shared + [self._take_free() for _ in range(need)]
        child.num_computed_tokens = full * self.block_size
        child.block_hashes = list(parent.block_hashes[:full])
        child.num_registered_blocks = min(parent.num_registered_blocks, full)
        self._join(child, 0)
        return True

    def holds(self, block: int, key: bytes) -> bool:
        """Whether ``block`` still holds the full block cached under ``key``."""
        return self.block_hash[block] == key

    def cached_block(self, key: bytes) -> int | None:
        return self.cached.get(key)

    def adopt_block(self, key: bytes, parent: bytes | None, tokens: list[int]) -> int | None:
        """A free block registered under ``key`` with one reference (the caller's pin), whose K/V the caller
        fills (a session read back from disk); None when no block is free. Reported stored like a computed one."""
        if self.num_available_blocks <= 0:
            return None
        b = self._take_free()
        self.cached[key], self.block_hash[b] = b, key
        if self.events is not None:
            self.events.stored([key], parent, tokens, None)
        return b

    def pin(self, block: int) -> None:
        """One more reference to a cached block: a sequence's prefix-cache hit, or a kept session's pin."""
        if self.ref_counts[block] == 0:
            del self.free[block]
        self.ref_counts[block] += 1

    def unpin(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free[block] = None  # still in the prefix cache until the LRU hands it out

    def free_seq(self, seq: Sequence) -> None:
        # Reverse order: a sequence's tail blocks are evicted before its head, which more prompts share.
        for b in reversed(seq.block_table):
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free[b] = None
        seq.block_table = []
        seq.num_computed_tokens = seq.num_cached_tokens = seq.num_registered_blocks = 0
        self._leave(seq)

    def forget_cache(self) -> None:
        """The KV pool's contents are gone (a level-1 sleep): every block free and out of the prefix cache. Only
        with no block held (ValueError otherwise)."""
        if any(self.ref_counts):
            raise ValueError("blocks are still held by sequences or kept sessions")
        self.cached.clear()
        self.block_hash = [None] * self.num_blocks
        self.free = OrderedDict((i, None) for i in range(self.num_blocks))
        if self.events is not None:
            self.events.cleared()

    # ------------------------------------------------------------ reservations
    def promised_to(self, seq: Sequence) -> int:
        return self._promised.get(owner(seq), 0)

    def _available_to(self, seq: Sequence) -> int:
        """Free blocks ``seq`` may take: those nobody was promised, plus its owner's own promise."""
        return len(self.free) - self.reserved + self.promised_to(seq)

    def _join(self, seq: Sequence, reserve: int) -> None:
        """``seq`` now holds blocks: a member of its owner's reservation (one is opened with ``reserve``)."""
        o = owner(seq)
        if o not in self._budget:
            if reserve <= 0:
                return
            self._budget[o], self._members[o] = reserve, []
        self._members[o].append(seq)
        self._refresh(o)

    def _leave(self, seq: Sequence) -> None:
        o = owner(seq)
        members = self._members.get(o)
        if members is None:
            return
        members[:] = [m for m in members if m is not seq]
        if members:
            self._refresh(o)
            return
        self.reserved -= self._promised.pop(o, 0)
        del self._budget[o], self._members[o]

    def _refresh(self, o: Sequence | SequenceGroup) -> None:
        budget = self._budget.get(o)
        if budget is None:
            return
        held = len({b for m in self._members[o] for b in m.block_table})
        promised = max(0, budget - held)
        self.reserved += promised - self._promised.get(o, 0)
        self._promised[o] = promised


def owner(seq: Sequence) -> Sequence | SequenceGroup:
    """Whose reservation a sequence's blocks count against: its beam group's, else its own."""
    return seq.group if seq.group is not None else seq

"""Finished generations kept for continuation by the client's key (the /api/* ``request_id``).

A session is the truth of a finished sequence, its token ids (prompt + everything generated, EOS and
stop-string tokens included), plus a cache: pins (reference counts) on the sequence's full KV blocks in
the prefix cache, so a continuation finds them by hash and recomputes at most the last partly filled
block. The pins are bounded (``max_sessions`` sessions, ``kv_share`` of the KV pool) and released least
recently used first, also whenever a request needs the blocks; a session without pins still continues,
recomputing from its tokens. Because a continuation reaches blocks only through the prefix cache's hash
lookup, a block released and handed to another request can never be read as the session's.

Sessions idle for ``idle_seconds`` are dropped (tokens too); their tokens are bounded in total by
``max_tokens``. ``tokens()`` is called from the tokenizer pool's threads; everything else runs on the
engine thread. The lock guards the table, not the block manager (engine thread only)."""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.sequence import Sequence

logger = logging.getLogger(__name__)


@dataclass
class Session:
    token_ids: tuple[int, ...]
    last_used: float
    blocks: list[int] = field(default_factory=list)  # pinned prefix-cache blocks (one reference each)


@dataclass
class SessionStats:
    held: int
    pinned_blocks: int
    hits: int
    evictions: int


class SessionStore:
    def __init__(self, blocks: BlockManager, *, max_sessions: int, kv_share: float, idle_seconds: float,
                 max_tokens: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.blocks = blocks
        self.max_sessions, self.idle_seconds, self.max_tokens = max_sessions, idle_seconds, max_tokens
        self.max_pinned = int(kv_share * blocks.num_blocks)
        self.clock = clock
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # least recently used first
        self._tokens = 0
        self.pinned = 0
        self.hits = 0
        self.evictions = 0  # sessions that lost their pins or were dropped to stay within the bounds
        # Told of a session about to lose its pins or be dropped (engine.sessions.session_spill writes it to disk first).
        self.on_evict: Callable[[str, Session], None] | None = None

    @property
    def enabled(self) -> bool:
        return self.max_sessions > 0

    # ------------------------------------------------------------ any thread
    def tokens(self, key: str) -> tuple[int, ...] | None:
        with self._lock:
            s = self._sessions.get(key)
            if s is None or self.clock() - s.last_used > self.idle_seconds:
                return None
            return s.token_ids

    def __len__(self) -> int:
        return len(self._sessions)

    def stats(self) -> SessionStats:
        return SessionStats(len(self._sessions), self.pinned, self.hits, self.evictions)

    # ------------------------------------------------------------ engine thread
    def continued(self, key: str) -> None:
        """A request continuing ``key`` was admitted to the engine."""
        self.hits += 1
        with self._lock:
            if key in self._sessions:
                self._sessions[key].last_used = self.clock()
                self._sessions.move_to_end(key)

    def keep(self, seq: Sequence) -> None:
        """``seq`` (with a session_id) finished: keep its tokens and pin its full prefix-cache blocks. Runs
        before the scheduler frees the sequence's own references."""
        key = seq.session_id
        if key is None or not self.enabled:
            return
        tokens = tuple(seq.token_ids())
        if len(tokens) > self.max_tokens:
            return
        pins = self._pin(seq)
        with self._lock:
            old = self._sessions.pop(key, None)
            self._sessions[key] = Session(tokens, self.clock(), pins)
            self._tokens += len(tokens) - (len(old.token_ids) if old else 0)
        if old is not None:
            self._unpin(old)
        self._enforce()

    def _pin(self, seq: Sequence) -> list[int]:
        bm = self.blocks
        if not bm.enable_prefix_caching:
            return []
        pins: list[int] = []
        for h in seq.block_hashes[:seq.num_registered_blocks]:
            b = bm.cached_block(h)
            if b is None:  # a chain link was handed out since: the blocks after it are unreachable
                break
            bm.pin(b)
            pins.append(b)
        self.pinned += len(pins)
        return pins

    def _unpin(self, s: Session) -> None:
        for b in s.blocks:
            self.blocks.unpin(b)
        self.pinned -= len(s.blocks)
        s.blocks = []

    def _enforce(self) -> None:
        """Drop sessions over the count and token bounds and release pins over the KV share, LRU first."""
        with self._lock:
            while len(self._sessions) > self.max_sessions or self._tokens > self.max_tokens:
                key, s = self._sessions.popitem(last=False)
                self._tokens -= len(s.token_ids)
                self._evict(key, s)
            over = [(k, s) for k, s in self._sessions.items() if s.blocks]
        while self.pinned > self.max_pinned and over:
            self._evict(*over.pop(0))

    def _evict(self, key: str, s: Session) -> None:
        if self.on_evict is not None:
            self.on_evict(key, s)
        self._unpin(s)
        self.evictions += 1

    def release(self, blocks_wanted: int) -> bool:
        """Free pinned blocks, least recently used session first, until ``blocks_wanted`` blocks are free or
        none are pinned. True if any pin was released (the caller retries its allocation)."""
        released = False
        with self._lock:
            holders = [(k, s) for k, s in self._sessions.items() if s.blocks]
        for key, s in holders:
            if self.blocks.num_free_blocks >= blocks_wanted:
                break
            self._evict(key, s)
            released = True
        return released

    def items(self) -> list[tuple[str, Session]]:
        """The kept sessions, least recently used first (a copy)."""
        with self._lock:
            return list(self._sessions.items())

    def adopt(self, key: str, tokens: tuple[int, ...], pins: list[int]) -> None:
        """Keep a session read back from disk or another replica: ``pins`` are blocks it already holds one
        reference to each (engine thread)."""
        with self._lock:
            old = self._sessions.pop(key, None)
            self._sessions[key] = Session(tokens, self.clock(), list(pins))
            self._tokens += len(tokens) - (len(old.token_ids) if old else 0)
        self.pinned += len(pins)
        if old is not None:
            self._unpin(old)
        self._enforce()

    def expire(self) -> None:
        """Drop sessions idle for longer than ``idle_seconds``."""
        now = self.clock()
        with self._lock:
            gone = []
            while self._sessions:
                key, s = next(iter(self._sessions.items()))
                if now - s.last_used <= self.idle_seconds:
                    break
                self._sessions.popitem(last=False)
                self._tokens -= len(s.token_ids)
                gone.append(s)
        for s in gone:
            self._unpin(s)
        if gone:
            logger.debug("dropped %d idle sessions", len(gone))

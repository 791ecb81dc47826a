"""Kept /api/* sessions on disk and between replicas (ScheduleConfig.sessionSpillDir).

A session (engine.sessions.session_store) is its token ids plus pins on its full KV blocks. Spilling writes both to one
file (engine.sessions.session_file: versioned, checksummed, tied to the model's identity): on drain (the engine's
shutdown, after its thread stopped), when the store is about to take a session's pins or drop it
(``SessionStore.on_evict``: the engine thread copies the K/V, engine.sessions.spill_writer writes the file off it),
and on demand (``spill``).
At start every file in the folder is read back: its blocks are written into free KV blocks, entered into
the prefix cache under the base model's hash chain and pinned, so a continuation recomputes at most the last
partly filled block; the file is then removed (the session is in memory again; the next drain writes it
anew). A file whose KV part is damaged or another model's gives the tokens only (recomputed); one that
cannot be trusted at all is refused and left in place, renamed ``*.refused``.

Only base-model, text-only sessions carry KV: their blocks' hashes must equal the base-model chain over
their tokens (an adapter's or media's K/V is never written under the base model's hashes). Others go as
tokens only.

Export / import (the management port): ``export(key)`` reads the pinned blocks from another thread and
checks afterwards that the session still holds the very same pins (a block is rewritten only after it
was unpinned and handed out again); ``import_(data)`` queues the file for the engine thread, which adopts
it at the start of its next step (``apply_pending``; ``pending`` makes the idle engine take a step)."""
from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path

import torch

from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.sessions.session_file import ModelIdentity, SessionFile, decode, encode
from mindie_service.engine.sessions.session_store import Session, SessionStore
from mindie_service.engine.sessions.spill_writer import SpillWriter, write_atomic
from mindie_service.errors import ValidationError

logger = logging.getLogger(__name__)

SUFFIX = ".session"
_SAMPLE = 1 << 22  # bytes hashed from each end of a weight file


def weights_fingerprint(folder: str) -> str:
    """SHA-256 over the checkpoint's config.json and, per weight file (sorted), its name, size and first and
    last 4 MiB: cheap at start, and different whenever the weights are."""
    h = hashlib.sha256()
    root = Path(folder)
    files = [root] if root.is_file() else sorted(p for p in root.iterdir() if p.suffix in (
        ".json", ".safetensors", ".gguf", ".bin"))
    for p in files:
        size = p.stat().st_size
        h.update(f"{p.name}:{size}".encode())
        with open(p, "rb") as f:
            h.update(f.read(_SAMPLE))
            if size > _SAMPLE:
                f.seek(max(_SAMPLE, size - _SAMPLE))
                h.update(f.read(_SAMPLE))
    return h.hexdigest()


def spill_cap(kv_pool: torch.Tensor, blocks: BlockManager, max_seq_len: int) -> int:
    """Bytes of the largest session file this engine can write or read: maxSeqLen tokens and their blocks."""
    per_block = kv_pool[:, :, 0].numel() * kv_pool.element_size()
    return 65536 + 8 * max_seq_len + per_block * blocks.blocks_needed(max_seq_len)


def model_identity(model_path: str, dtype: str, block_size: int, kv_dtype: str,
                   kv_pool: torch.Tensor) -> ModelIdentity:
    """What a session file must match to be read into this engine (the pool is [layers, 2, blocks, block_size,
    kv_heads, row]: its shape without the block count)."""
    shape = kv_pool.shape
    return ModelIdentity(weights=weights_fingerprint(model_path), dtype=dtype, block_size=block_size,
                         kv_dtype=kv_dtype, kv_shape=(shape[0], shape[1], *shape[3:]))


def file_name(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:40] + SUFFIX


class SessionSpill:
    """Kept sessions on disk: it reads the block manager, the session store and the KV pool it is handed, and
    the model identity every file it writes or reads carries."""

    def __init__(self, blocks: BlockManager, store: SessionStore, kv_pool: torch.Tensor, identity: ModelIdentity,
                 folder: str, max_bytes: int) -> None:
        self.blocks, self.store, self.kv_pool, self.identity = blocks, store, kv_pool, identity
        self.folder, self.max_bytes = Path(folder), max_bytes
        self.folder.mkdir(parents=True, exist_ok=True)
        self._pending: list[tuple[SessionFile, threading.Event]] = []
        self._lock = threading.Lock()
        self.spilled = self.restored = self.refused = 0
        self.writer = SpillWriter()

    # ------------------------------------------------------------ writing
    def _kv_blocks(self, s: Session) -> list[int]:
        """The leading pinned blocks that hold the base model's K/V of ``s``'s tokens."""
        bm = self.blocks
        bs = bm.block_size
        parent, out = b"", []
        for i, b in enumerate(list(s.blocks)):
            h = bm.block_key(parent, list(s.token_ids[i * bs:(i + 1) * bs]))
            if not bm.holds(b, h):
                break
            out.append(b)
            parent = h
        return out

    def snapshot(self, key: str, s: Session) -> bytes:
        pins = list(s.blocks)
        blocks = self._kv_blocks(s)
        pool = self.kv_pool
        kv = pool.index_select(2, torch.tensor(blocks, dtype=torch.long, device=pool.device)).movedim(2, 0).cpu() \
            if blocks else pool[:, :, :0].movedim(2, 0).cpu()
        if s.blocks != pins:  # the pins went while copying (export from another thread): tokens only
            kv = kv[:0]
        raw = kv.contiguous().view(torch.uint8).numpy().tobytes()
        return encode(key, tuple(s.token_ids), self.identity, str(kv.dtype), tuple(kv.shape), raw)

    def spill(self, key: str, s: Session, background: bool = False) -> bool:
        data = self.snapshot(key, s)
        if len(data) > self.max_bytes:
            logger.warning("session not spilled: %d bytes over the cap of %d", len(data), self.max_bytes)
            return False
        path = self.folder / file_name(key)
        if background:
            self.writer.submit(path, data)
        else:
            write_atomic(path, data)
        self.spilled += 1
        return True

    def on_evict(self, key: str, s: Session) -> None:
        if s.blocks:  # the K/V is copied now (its blocks go next); the file is written off the engine thread
            self.spill(key, s, background=True)

    def spill_all(self) -> int:
        self.writer.flush()
        n = sum(1 for key, s in self.store.items() if self.spill(key, s))
        logger.info("spilled %d session(s) to %s", n, self.folder)
        return n

    def export(self, key: str) -> bytes | None:
        for k, s in self.store.items():
            if k == key:
                return self.snapshot(key, s)
        path = self.folder / file_name(key)
        queued = self.writer.pending(path)
        if queued is not None:
            return queued
        return path.read_bytes() if path.is_file() else None

    # ------------------------------------------------------------ reading (engine thread)
    def restore_all(self) -> None:
        for path in sorted(self.folder.glob("*" + SUFFIX)):
            try:
                f = decode(path.read_bytes(), self.identity, self.max_bytes)
            except (ValidationError, OSError) as exc:
                logger.warning("session file %s refused: %s", path.name, exc)
                self.refused += 1
                path.rename(path.with_suffix(".refused"))
                continue
            self.adopt(f)
            path.unlink()

    def adopt(self, f: SessionFile) -> int:
        """Keep ``f``'s session; its K/V into free blocks when usable. Returns the blocks pinned."""
        pins = self._place(f) if f.kv is not None else []
        if f.kv is None:
            logger.warning("session %s: its KV blocks are not usable here (damaged or another model's); "
                           "it continues from its tokens", f.key[:8])
        self.store.adopt(f.key, f.tokens, pins)
        self.restored += 1
        return len(pins)

    def _place(self, f: SessionFile) -> list[int]:
        bm, pool = self.blocks, self.kv_pool
        bs = bm.block_size
        try:
            kv = torch.frombuffer(bytearray(f.kv or b""), dtype=torch.uint8).view(pool.dtype).reshape(f.kv_shape)
        except RuntimeError:  # sizes the identity check let through but the bytes do not fill
            return []
        pins: list[int] = []
        parent: bytes | None = None
        for i in range(min(kv.shape[0], len(f.tokens) // bs)):
            tokens = list(f.tokens[i * bs:(i + 1) * bs])
            h = bm.block_key(parent or b"", tokens)
            b = bm.cached_block(h)
            if b is not None:
                bm.pin(b)
            else:
                b = bm.adopt_block(h, parent, tokens)  # one reference: the session's pin
                if b is None:
                    break
                pool[:, :, b] = kv[i].to(pool.device)
            pins.append(b)
            parent = h
        return pins

    # ------------------------------------------------------------ import from another replica
    def import_(self, data: bytes) -> threading.Event:
        """Check ``data`` now (ValidationError), adopt it at the engine thread's next step."""
        f = decode(data, self.identity, self.max_bytes)
        done = threading.Event()
        with self._lock:
            self._pending.append((f, done))
        return done

    def pending(self) -> bool:
        return bool(self._pending)

    def apply_pending(self) -> None:
        with self._lock:
            todo, self._pending = self._pending, []
        for f, done in todo:
            self.adopt(f)
            done.set()

"""The KV-event publisher: the prefix cache's changes, in vLLM's wire format, over a ZMQ PUB socket.

The block manager reports each change to a ``KVEventRecorder`` (a ``BlockEventSink``) on the engine
thread; at the end of each step the recorder's events become one ``KVEventBatch`` handed to the
publisher's bounded queue without waiting (a full queue drops the batch and counts it:
``dropped_batches``, on /metrics ``kv_events_dropped_batches``). The publisher's thread encodes
each batch with msgspec's msgpack and sends three frames, as vLLM does: topic, an 8-byte big-endian
sequence number, payload. It keeps the last ``buffer_steps`` payloads for the replay socket (a ROUTER:
a client sends ``[b"", start_seq (8 bytes)]`` and gets ``[b"", seq, payload]`` for each kept batch
from there, then ``[b"", -1 (8 bytes, signed), b""]``).

Unlike vLLM, the publisher always binds its endpoints (subscribers connect), whatever the address."""
from __future__ import annotations

import logging
import queue
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass
from itertools import count
from typing import Sequence

import msgspec
import zmq

from mindie_service.engine.configs.kv_events_config import KVEventsConfig
from mindie_service.engine.kv.kv_event_wire import (MEDIUM_GPU, SPEC_KIND, AllBlocksCleared, BlockRemoved, BlockStored,
                                                 KVEventBatch, external_hash)

logger = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
_POLL_S = 0.05
_SHUTDOWN_S = 1.0


def lora_int_id(name: str | None) -> int | None:
    """A stable integer for an adapter name (the deprecated ``lora_id`` field; ``lora_name`` is the key):
    the same on every replica, never 0 (vLLM's ids start at 1)."""
    return None if name is None else (zlib.crc32(name.encode()) & 0x7FFFFFFF) or 1


class KVEventRecorder:
    """A ``BlockEventSink`` collecting one step's events."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.pending: list[BlockStored | BlockRemoved | AllBlocksCleared] = []

    def stored(self, block_hashes: Sequence[bytes], parent_hash: bytes | None, token_ids: Sequence[int],
               lora_name: str | None) -> None:
        self.pending.append(BlockStored(
            block_hashes=[external_hash(h) for h in block_hashes],
            parent_block_hash=None if parent_hash is None else external_hash(parent_hash),
            token_ids=list(token_ids), block_size=self.block_size, lora_id=lora_int_id(lora_name),
            medium=MEDIUM_GPU, lora_name=lora_name, group_idx=0, kv_cache_spec_kind=SPEC_KIND))

    def removed(self, block_hashes: Sequence[bytes]) -> None:
        self.pending.append(BlockRemoved(block_hashes=[external_hash(h) for h in block_hashes], medium=MEDIUM_GPU,
                                         group_idx=0))

    def cleared(self) -> None:
        self.pending.append(AllBlocksCleared())

    def take(self, rank: int) -> KVEventBatch | None:
        if not self.pending:
            return None
        batch = KVEventBatch(ts=time.time(), events=self.pending, data_parallel_rank=rank)
        self.pending = []
        return batch


@dataclass(frozen=True)
class PublisherStats:
    published_batches: int
    dropped_batches: int
    queued_batches: int


class ZmqKVEventPublisher:
    """PUB + optional replay ROUTER, both bound; a thread of its own sends. ``publish`` never blocks."""

    def __init__(self, cfg: KVEventsConfig) -> None:
        self.cfg = cfg
        self._queue: queue.Queue[KVEventBatch | None] = queue.Queue(maxsize=cfg.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=cfg.buffer_steps)
        self._ctx = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(cfg.hwm)
        self._replay: zmq.Socket | None = None
        try:
            self._pub.bind(cfg.endpoint)
            if cfg.replay_endpoint:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.bind(cfg.replay_endpoint)
        except zmq.ZMQError:
            self._close_sockets()
            raise
        self._topic = cfg.topic.encode()
        self._seq = count()
        self.published = 0
        self.dropped = 0
        self._running = True
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"kv-events-{cfg.rank}")
        self._thread.start()
        logger.info("KV events: publishing on %s (replay %s, topic %r)", cfg.endpoint, cfg.replay_endpoint, cfg.topic)

    def publish(self, batch: KVEventBatch) -> None:
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self.dropped += 1

    def stats(self) -> PublisherStats:
        return PublisherStats(self.published, self.dropped, self._queue.qsize())

    def shutdown(self) -> None:
        """Send what is queued (for at most a second), then close the sockets."""
        if not self._running:
            return
        self._running = False
        deadline = time.monotonic() + _SHUTDOWN_S
        while not self._queue.empty() and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(timeout=_SHUTDOWN_S)
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def _loop(self) -> None:
        pack = msgspec.msgpack.Encoder()
        while self._running or not self._queue.empty():
            if self._replay is not None and self._replay.poll(0):
                try:
                    self._serve_replay()
                except zmq.ZMQError:
                    logger.exception("KV events: replay request failed")
            try:
                batch = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if batch is None:
                break
            self._send(pack, batch)

    def _send(self, pack: msgspec.msgpack.Encoder, batch: KVEventBatch) -> None:
        seq = next(self._seq)
        payload = pack.encode(batch)
        try:
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        except zmq.ZMQError:
            logger.exception("KV events: send failed")
        self._buffer.append((seq, payload))
        self.published += 1

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            logger.warning("KV events: malformed replay request (%d frames)", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= first:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_SEQ, b""))


class KVEvents:
    """The engine's end of KV events: the recorder its block manager feeds, flushed once per step."""

    def __init__(self, cfg: KVEventsConfig, block_size: int) -> None:
        cfg.validate()
        self.cfg = cfg
        self.recorder = KVEventRecorder(block_size)
        self.publisher = ZmqKVEventPublisher(cfg)
        self.recorder.cleared()  # a fresh engine: whatever a subscriber knew of this endpoint is gone

    def end_step(self) -> None:
        batch = self.recorder.take(self.cfg.rank)
        if batch is not None:
            self.publisher.publish(batch)

    def stats(self) -> PublisherStats:
        return self.publisher.stats()

    def shutdown(self) -> None:
        self.end_step()
        self.publisher.shutdown()

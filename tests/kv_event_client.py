"""A KV-event subscriber built from plain pyzmq + msgspec (what a router does), for the tests."""
from __future__ import annotations

import socket
import threading
from typing import Any

import msgspec
import zmq


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Subscriber:
    """Collects (seq, decoded batch) from a PUB endpoint on a thread; ``replay`` asks the ROUTER."""

    def __init__(self, endpoint: str, topic: str = "") -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.sub.connect(endpoint)
        self.frames: list[tuple[bytes, int, bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.sub.poll(20):
                topic, seq, payload = self.sub.recv_multipart()
                self.frames.append((topic, int.from_bytes(seq, "big"), payload))

    def wait_for(self, n: int, timeout: float = 5.0) -> None:
        import time
        end = time.monotonic() + timeout
        while len(self.frames) < n and time.monotonic() < end:
            time.sleep(0.01)

    def batches(self) -> list[dict[str, Any]]:
        return [msgspec.msgpack.decode(p) for _, _, p in self.frames]

    def replay(self, endpoint: str, start: int) -> list[tuple[int, bytes]]:
        req = self.ctx.socket(zmq.DEALER)
        req.connect(endpoint)
        req.send_multipart([b"", start.to_bytes(8, "big")])
        out: list[tuple[int, bytes]] = []
        while req.poll(5000):
            _, seq, payload = req.recv_multipart()
            s = int.from_bytes(seq, "big", signed=True)
            if s == -1:
                break
            out.append((s, payload))
        req.close(linger=0)
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sub.close(linger=0)
        self.ctx.term()


def rebuild(batches: list[dict[str, Any]]) -> tuple[set[int], list[str]]:
    """The cached block hashes the events describe, and every inconsistency seen on the way (a parent may be
    uncached: its tokens were computed twice and the other copy was the cached one)."""
    cached: set[int] = set()
    problems: list[str] = []
    for b in batches:
        for ev in b["events"]:
            kind = ev["type"]
            if kind == "AllBlocksCleared":
                cached.clear()
            elif kind == "BlockStored":
                if len(ev["token_ids"]) != len(ev["block_hashes"]) * ev["block_size"]:
                    problems.append(f"token_ids of {ev}")
                cached.update(ev["block_hashes"])
            elif kind == "BlockRemoved":
                missing = set(ev["block_hashes"]) - cached
                if missing:
                    problems.append(f"removed unknown {missing}")
                cached.difference_update(ev["block_hashes"])
            else:
                problems.append(f"unknown event {kind}")
    return cached, problems

"""KV-cache events: the block manager's sink interface and the publisher's settings (no dependencies).

The block manager reports each block whose hash enters the prefix cache (``stored``) or leaves it
(``removed``: the LRU handed the block out again) to a ``BlockEventSink``; the KV-event publisher
(``engine.kv_events``, vLLM's wire format over ZMQ) and the instance router's prefix index
(``engine.prefix_routing``) are such sinks. Calls come on the engine thread, inside the step: a sink
only records, it never blocks."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol, Sequence

from mindie_service.errors import check

PUBLISHERS = ("null", "zmq")


class BlockEventSink(Protocol):
    def stored(self, block_hashes: Sequence[bytes], parent_hash: bytes | None, token_ids: Sequence[int],
               lora_name: str | None) -> None:
        """Consecutive full blocks of one sequence entered the prefix cache (``parent_hash``: the block
        before the first, None at the start of a prompt); ``token_ids`` are theirs, block after block."""

    def removed(self, block_hashes: Sequence[bytes]) -> None:
        """These blocks left the prefix cache (evicted: their block was handed out again)."""

    def cleared(self) -> None:
        """The whole prefix cache is empty (a fresh engine)."""


class FanOutSink:
    """Several sinks as one."""

    def __init__(self, sinks: Sequence[BlockEventSink]) -> None:
        self.sinks = list(sinks)

    def stored(self, block_hashes: Sequence[bytes], parent_hash: bytes | None, token_ids: Sequence[int],
               lora_name: str | None) -> None:
        for s in self.sinks:
            s.stored(block_hashes, parent_hash, token_ids, lora_name)

    def removed(self, block_hashes: Sequence[bytes]) -> None:
        for s in self.sinks:
            s.removed(block_hashes)

    def cleared(self) -> None:
        for s in self.sinks:
            s.cleared()


@dataclass(frozen=True)
class KVEventsConfig:
    """BackendConfig.kvEventsConfig: vLLM's KVEventsConfig fields (camelCase in config.json).

    ``rank`` is not a config key: it is the instance's number (``data_parallel_rank`` on the wire), and
    the endpoints' ports are offset by it, as vLLM offsets them per data-parallel rank."""

    enable_kv_cache_events: bool = False
    publisher: str = "zmq"
    endpoint: str = "tcp://127.0.0.1:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""
    rank: int = 0

    @property
    def active(self) -> bool:
        return self.enable_kv_cache_events and self.publisher != "null"

    def validate(self) -> None:
        check(self.publisher in PUBLISHERS, "kv_events.publisher", "one of null, zmq", self.publisher)
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            v = getattr(self, name)
            check(isinstance(v, int) and v >= 1, f"kv_events.{name}", "an integer >= 1", v)
        for name in ("endpoint", "replay_endpoint"):
            v = getattr(self, name)
            if v is not None:
                check(v.startswith(("tcp://", "ipc://", "inproc://")), f"kv_events.{name}",
                      "a ZMQ endpoint (tcp://host:port, ipc://path or inproc://name)", v)

    def for_instance(self, rank: int) -> "KVEventsConfig":
        """This config for instance ``rank``: tcp ports + rank, other endpoints suffixed ``_dp<rank>``."""
        return dataclasses.replace(self, rank=rank, endpoint=offset_endpoint(self.endpoint, rank),
                                   replay_endpoint=offset_endpoint(self.replay_endpoint, rank))


def offset_endpoint(endpoint: str | None, rank: int) -> str | None:
    if not endpoint or rank == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        return f"{base}:{int(port) + rank}"
    return f"{endpoint}_dp{rank}"

"""KV-cache events' settings (BackendConfig.kvEventsConfig), apart from the publisher (engine.kv.kv_events)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mindie_service.errors import check

PUBLISHERS = ("null", "zmq")


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

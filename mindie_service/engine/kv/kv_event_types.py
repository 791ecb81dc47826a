"""KV-cache events: the block manager's sink interface (no dependencies; the settings are engine.configs.kv_events_config).

The block manager reports each block whose hash enters the prefix cache (``stored``) or leaves it
(``removed``: the LRU handed the block out again) to a ``BlockEventSink``; the KV-event publisher
(``engine.kv.kv_events``, vLLM's wire format over ZMQ) and the instance router's prefix index
(``fleet.prefix_routing``) are such sinks. Calls come on the engine thread, inside the step: a sink
only records, it never blocks."""
from __future__ import annotations

from typing import Protocol, Sequence




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

"""vLLM's KV-event wire format (vllm/distributed/kv_events.py as read at vLLM commit 0181ea3: the events are
tagged maps since vLLM dropped msgspec's array_like encoding).

msgspec structs encoded with ``msgspec.msgpack``: a ``KVEventBatch`` (``ts``, ``events``,
``data_parallel_rank``) of tagged events, each a map whose ``type`` names its class (``BlockStored``,
``BlockRemoved``, ``AllBlocksCleared``). Fields with defaults are left out when at their default
(``omit_defaults``). Block hashes go out as vLLM sends them by default
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``): the low 64 bits of the block's hash, big-endian, as an
unsigned integer. A consumer decodes them with its own copy of these classes (or plain msgpack)."""
from __future__ import annotations

from typing import Any, Union

import msgspec

MEDIUM_GPU = "GPU"  # vLLM's name for the accelerator's KV pool (also ours on an NPU or the CPU)
SPEC_KIND = "full_attention"


class EventBatch(msgspec.Struct, omit_defaults=True, gc=False):  # type: ignore[call-arg]
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    """Base class of the KV-cache events."""


class BlockStored(KVCacheEvent):
    block_hashes: list[Union[bytes, int]]
    parent_block_hash: Union[bytes, int, None]
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[Union[bytes, int]]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]


def external_hash(h: bytes) -> int:
    """vLLM's ``maybe_convert_block_hash`` with int hashes on (its default)."""
    return int.from_bytes(h, "big") & ((1 << 64) - 1)


def decode_batch(payload: bytes) -> KVEventBatch:
    return msgspec.msgpack.decode(payload, type=KVEventBatch)

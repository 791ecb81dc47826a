"""Prefix-aware routing across model instances (BackendConfig.modelInstanceNumber > 1,
``BackendConfig.instanceRouting: "prefix"``, the default).

Each instance's block manager reports the blocks entering and leaving its prefix cache (the KV-event
sink, ``kv_event_types.BlockEventSink``) to a ``PrefixIndex``. An engine's block hashes include
the instance's own LoRA identities, so the index re-keys each block by what any instance would agree on:
a chain over (the parent block's key, the block's token ids, the adapter's name). The router keys a
request's prompt the same way and asks each index how many of its leading full blocks it holds.

The rule (``PrefixRouter.choose``), among healthy instances:

1. ``best``: the instance holding the longest cached prefix of the prompt (ties: fewer requests in
   flight, then the least-loaded order); ``least``: the least-loaded instance (requests in flight, then
   prompt tokens not yet answered: the plain router's choice).
2. Go to ``best`` when it holds more of the prompt than ``least`` and is not much more loaded:
   ``in_flight(best) - in_flight(least) <= max(LOAD_SLACK, in_flight(least))``, i.e. at most
   ``LOAD_SLACK`` (4) more requests in flight, or at most twice ``least``'s when that is larger.
   Otherwise ``least``. A prompt with media, or shorter than one block, goes to ``least``.

3. Without a longer cached prefix anywhere, a request naming a prompt-cache key (OpenAI's ``prompt_cache_key``,
   ``SamplingParams.cache_key``) goes to the instance that key went to last, under the same load bound: requests
   sharing a prefix that is still being computed (no block stored yet) meet on one instance.

A session's continuation still goes to the instance that holds it (the router decides that first)."""
from __future__ import annotations

import hashlib
import logging
from array import array
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

from mindie_service.sampling_params import is_base_adapter

logger = logging.getLogger(__name__)

LOAD_SLACK = 4
MAX_AFFINITY = 4096  # prompt-cache keys remembered (least recent dropped)
ROUTINGS = ("prefix", "leastLoaded")


def route_key(parent: bytes, tokens: Sequence[int], lora_name: str | None) -> bytes:
    h = hashlib.sha256(parent)
    h.update(array("q", tokens).tobytes())
    h.update(b"lora:" + lora_name.encode() if lora_name else b"")
    return h.digest()


class PrefixIndex:
    """One instance's cached blocks under instance-neutral keys; a ``BlockEventSink`` (engine thread).
    Reads (``held``) come from the router's thread: single dict/Counter lookups, safe under the GIL."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._key: dict[bytes, bytes] = {}  # engine block hash -> route key
        self._count: Counter[bytes] = Counter()  # route key -> cached blocks with it

    def stored(self, block_hashes: Sequence[bytes], parent_hash: bytes | None, token_ids: Sequence[int],
               lora_name: str | None) -> None:
        parent = b"" if parent_hash is None else self._key.get(parent_hash)
        if parent is None:  # its parent's copy is not the cached one: this chain cannot be keyed
            return
        bs = self.block_size
        for i, h in enumerate(block_hashes):
            parent = route_key(parent, token_ids[i * bs:(i + 1) * bs], lora_name)
            self._key[h] = parent
            self._count[parent] += 1

    def removed(self, block_hashes: Sequence[bytes]) -> None:
        for h in block_hashes:
            k = self._key.pop(h, None)
            if k is not None:
                self._count[k] -= 1
                if self._count[k] <= 0:
                    del self._count[k]

    def cleared(self) -> None:
        self._key.clear()
        self._count.clear()

    def held(self, keys: Sequence[bytes]) -> int:
        """How many of ``keys`` (a prompt's block keys, in order) this instance holds from the start."""
        n = 0
        for k in keys:
            if self._count.get(k, 0) <= 0:
                break
            n += 1
        return n


@dataclass(frozen=True)
class Choice:
    instance: int
    cached_blocks: int  # of the prompt, on the chosen instance
    by_prefix: bool  # chosen for its prefix (not the least-loaded one)


class PrefixRouter:
    def __init__(self, indexes: Sequence[PrefixIndex], block_size: int) -> None:
        self.indexes, self.block_size = list(indexes), block_size
        self.prefix_routed = 0  # requests sent to an instance for its cached prefix
        self.affinity: OrderedDict[str, int] = OrderedDict()  # prompt-cache key -> the instance it went to last

    @classmethod
    def attach(cls, engines: Sequence[Any]) -> "PrefixRouter | None":
        """An index on each instance's block manager; None when an instance has no step engine (a mock) or
        no prefix cache."""
        steps = [getattr(e, "engine", None) for e in engines]
        if any(s is None or not hasattr(s, "add_block_sink") or not s.cfg.enable_prefix_caching for s in steps):
            return None
        bs = steps[0].cfg.cache_block_size
        indexes = [PrefixIndex(bs) for _ in steps]
        for step, index in zip(steps, indexes):
            step.add_block_sink(index)
        return cls(indexes, bs)

    def keys(self, request: Any) -> list[bytes]:
        if getattr(request, "mm_hashes", None):
            return []
        ids, bs = request.prompt_token_ids, self.block_size
        adapter = request.params.adapter_id
        lora = None if is_base_adapter(adapter) else adapter
        keys: list[bytes] = []
        parent = b""
        for i in range(len(ids) // bs):
            parent = route_key(parent, ids[i * bs:(i + 1) * bs], lora)
            keys.append(parent)
        return keys

    def choose(self, request: Any, order: Sequence[int], in_flight: Sequence[int], least: int) -> Choice:
        """``order``: healthy instances in turn order; ``least``: the least-loaded one among them. Without a
        longer cached prefix anywhere, a request naming a prompt-cache key goes where that key went last (its
        prefix may still be computing there), under the same load bound."""
        keys = self.keys(request)
        held = {i: self.indexes[i].held(keys) if keys else 0 for i in order}
        best = max(order, key=lambda i: (held[i], -in_flight[i], i == least))
        near = in_flight[best] - in_flight[least] <= max(LOAD_SLACK, in_flight[least])
        if held[best] > held[least] and near:
            self.prefix_routed += 1
            return self._keep(request, Choice(best, held[best], True))
        went = self.affinity.get(getattr(request.params, "cache_key", None) or "")
        if went in held and in_flight[went] - in_flight[least] <= max(LOAD_SLACK, in_flight[least]):
            return self._keep(request, Choice(went, held[went], went != least))
        return self._keep(request, Choice(least, held[least], False))

    def _keep(self, request: Any, choice: Choice) -> Choice:
        """Remember where a prompt-cache key went (the newest ``MAX_AFFINITY`` keys)."""
        key = getattr(request.params, "cache_key", None)
        if key:
            self.affinity[key] = choice.instance
            self.affinity.move_to_end(key)
            while len(self.affinity) > MAX_AFFINITY:
                self.affinity.popitem(last=False)
        return choice


def use_prefix_routing(engine: Any, routing: str) -> Any:
    """``engine`` (an ``InstanceRouter`` or a lone engine) routing by cached prefix when ``routing`` is "prefix"
    and its instances can tell (real engines with a prefix cache)."""
    if routing == "prefix" and hasattr(engine, "engines") and hasattr(engine, "prefix"):
        engine.prefix = PrefixRouter.attach(engine.engines)
        logger.info("instance routing: %s", "by cached prefix" if engine.prefix else "least loaded (no prefix cache)")
    return engine

"""The engine's LoRA adapters: a registry of known adapters over a pool of resident slots.

Life of a request that names an adapter:
  ``bind`` (add_request)       resolve the name (unknown -> ValidationError, 422), count the request
                               as a user (unload is refused while any remain), return the cache key
                               that keeps its prefix-cache blocks apart from every other adapter's;
  ``acquire`` (admission)      pin the adapter in a pool slot (evicting the least recently used idle
                               adapter when it is not resident) and return the slot; None = wait;
  ``step_applier`` (runner)    write the adapters newly given a slot into the pool's tensors, then
                               build the step's applier;
  ``release`` (preempt/finish) unpin; on finish (or abort) also stop counting the request.

The scheduler only chooses slots; the tensor writes happen in the runner's call, between steps.

``load`` / ``unload`` / ``list`` may be called from any thread: they touch only the registry under
the lock (reading and validating a folder happens outside it). The pool's tensors are written
only by ``step_applier``, on the engine thread before a forward, so requests in flight keep their
adapter while others come and go. Requests are known by id: lora never sees the engine's types."""
from __future__ import annotations

import logging
import threading
from typing import Any, Iterable

import torch
from torch import nn

from mindie_service.lora.adapter import LoraAdapter, read_adapter
from mindie_service.lora.apply import BatchedLoraApplier, build_applier
from mindie_service.lora.pool import AdapterPool
from mindie_service.errors import ConflictError, NotFoundError, ValidationError
from mindie_service.params.adapter_name import check_adapter_id, is_base_adapter

logger = logging.getLogger(__name__)



class LoraManager:
    def __init__(self, model: nn.Module, max_loras: int, max_rank: int, device: torch.device,
                 dtype: torch.dtype, modules: Iterable[tuple[str, str]] = (), reserved: Iterable[str] = ()) -> None:
        """``modules``: the static adapters (name, folder) of the config. ``reserved``: names an adapter may
        not take (the served model's). A model without the Llama layer layout gets no pool: loading an
        adapter for it is refused."""
        self.model, self.max_loras, self.max_rank = model, max_loras, max_rank
        self.device, self.dtype = device, dtype
        self.reserved = frozenset(n for n in reserved if n)
        try:
            self.pool: AdapterPool | None = AdapterPool(model, max_loras, device, dtype)
        except (AttributeError, IndexError, TypeError):
            self.pool = None
        self.registry: dict[str, LoraAdapter] = {}
        self._bound: dict[str, LoraAdapter] = {}  # request id -> its adapter
        self._pinned: set[str] = set()  # request ids holding a pin on their adapter's slot
        self._lock = threading.RLock()
        for name, path in modules:  # static adapters (LoraModules): a bad one stops start-up
            self.load(name, path)
        with self._lock:  # make them resident up front (config allows at most maxLoras of them)
            for adapter in list(self.registry.values())[:max_loras]:
                if self.pool is not None and self.pool.acquire(adapter):
                    self.pool.release(adapter)
            if self.pool is not None:
                self.pool.flush_writes()

    # ------------------------------------------------------------ registry (any thread)
    def load(self, name: str, path: str) -> dict[str, Any]:
        """Register an adapter. ConflictError when the name is taken; ValidationError for a bad folder."""
        if name in self.registry:
            raise ConflictError(f"LoRA adapter {name!r} is already loaded")
        if name in self.reserved:
            raise ValidationError(f"LoRA adapter {name!r}: the name must differ from the served model's name")
        if self.max_loras < 1:
            raise ValidationError(f"LoRA adapter {name!r}: maxLoras is 0, no adapter can be served")
        if self.pool is None:
            raise ValidationError(f"LoRA adapter {name!r}: this model does not support LoRA adapters")
        adapter = read_adapter(name, path, self.model, self.max_rank, self.dtype)  # host copy, off the lock
        with self._lock:
            if name in self.registry:
                raise ConflictError(f"LoRA adapter {name!r} is already loaded")
            self.registry[name] = adapter
        logger.info("LoRA adapter %r loaded from %s (rank %d, %s)", name, path, adapter.rank,
                    ",".join(adapter.targets))
        return adapter.info()

    def unload(self, name: str) -> None:
        """Forget an adapter. NotFoundError when unknown; ConflictError while requests use it."""
        with self._lock:
            adapter = self.registry.get(name)
            if adapter is None:
                raise NotFoundError(f"LoRA adapter {name!r} is not loaded")
            if adapter.refs > 0:
                raise ConflictError(f"LoRA adapter {name!r} is in use by {adapter.refs} request(s); "
                                    f"unload it when they have finished")
            if self.pool is not None:
                self.pool.drop(adapter)
            del self.registry[name]
        logger.info("LoRA adapter %r unloaded", name)

    def list(self) -> list[dict[str, Any]]:
        with self._lock:
            return [a.info() for a in self.registry.values()]

    def names(self) -> list[str]:
        with self._lock:
            return list(self.registry)

    # ------------------------------------------------------------ requests (engine thread)
    def bind(self, request_id: str, adapter_id: str | None) -> bytes:
        """Resolve a request's adapter; returns its prefix-cache key (b"" for the base model)."""
        if is_base_adapter(adapter_id):
            return b""
        with self._lock:
            adapter = self.registry[check_adapter_id(adapter_id, self.registry)]  # type: ignore[index]
            adapter.refs += 1
            self._bound[request_id] = adapter
            return adapter.cache_key

    def acquire(self, request_id: str) -> int | None:
        """Pin the request's adapter in a slot and return it (0: the base model); None when every slot
        is pinned by running requests (the request waits)."""
        adapter = self._bound.get(request_id)
        if adapter is None:
            return 0
        with self._lock:
            assert self.pool is not None  # an adapter was loaded, so the model has a pool
            if request_id in self._pinned:
                return adapter.slot
            if not self.pool.acquire(adapter):
                return None
            self._pinned.add(request_id)
            return adapter.slot

    def release(self, request_id: str, done: bool) -> None:
        adapter = self._bound.get(request_id)
        if adapter is None:
            return
        with self._lock:
            if request_id in self._pinned and self.pool is not None:
                self.pool.release(adapter)
                self._pinned.discard(request_id)
            if done:
                adapter.refs -= 1
                del self._bound[request_id]

    def step_applier(self, slots: list[int], counts: list[int]) -> BatchedLoraApplier | None:
        """The runner's lora_hook: write pending adapters into the pool, then the step's applier; None (no
        overhead) when every row of the forward is on the base model."""
        if not any(slots) or self.pool is None:
            return None
        with self._lock:
            self.pool.flush_writes()
        return build_applier(self.pool, slots, counts)

"""The engine's LoRA adapters: a registry of known adapters over a pool of resident slots.

Life of a request that names an adapter:
  ``bind`` (add_request)       resolve the name (unknown -> ValidationError, 422), count the request
                               as a user (unload is refused while any remain), return the cache key
                               that keeps its prefix-cache blocks apart from every other adapter's;
  ``acquire`` (admission)      pin the adapter in a pool slot, loading it (and evicting the least
                               recently used idle adapter) when it is not resident; False = wait;
  ``release`` (preempt/finish) unpin; on finish (or abort) also stop counting the request.

``load`` / ``unload`` / ``list`` may be called from any thread: they touch only the registry under
the lock (reading and validating a folder happens outside it). The pool's tensors are written
only by ``acquire``, i.e. on the engine thread between steps, so requests in flight keep their
adapter while others come and go."""
from __future__ import annotations

import logging
import threading
from typing import Any, Iterable

import torch
from torch import nn

from mindie_service.engine.config import LoraModuleSpec
from mindie_service.engine.sequence import Sequence
from mindie_service.lora.adapter import LoraAdapter, read_adapter
from mindie_service.lora.apply import BatchedLoraApplier, build_applier
from mindie_service.lora.pool import AdapterPool
from mindie_service.errors import ConflictError, NotFoundError, ValidationError

logger = logging.getLogger(__name__)

BASE_NAMES = (None, "None")


class LoraManager:
    def __init__(self, model: nn.Module, max_loras: int, max_rank: int, device: torch.device,
                 dtype: torch.dtype, modules: Iterable[LoraModuleSpec] = (), reserved: Iterable[str] = ()) -> None:
        """``reserved``: names an adapter may not take (the served model's). A model without the Llama
        layer layout gets no pool: loading an adapter for it is refused."""
        self.model, self.max_loras, self.max_rank = model, max_loras, max_rank
        self.device, self.dtype = device, dtype
        self.reserved = frozenset(n for n in reserved if n)
        try:
            self.pool: AdapterPool | None = AdapterPool(model, max_loras, device, dtype)
        except (AttributeError, IndexError, TypeError):
            self.pool = None
        self.registry: dict[str, LoraAdapter] = {}
        self._bound: dict[str, LoraAdapter] = {}  # request id -> its adapter
        self._lock = threading.RLock()
        for spec in modules:  # static adapters (LoraModules): a bad one stops start-up
            self.load(spec.name, spec.path)
        with self._lock:  # make them resident up front (config allows at most maxLoras of them)
            for adapter in list(self.registry.values())[:max_loras]:
                if self.pool is not None and self.pool.acquire(adapter):
                    self.pool.release(adapter)

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
        if adapter_id in BASE_NAMES:
            return b""
        with self._lock:
            adapter = self.registry.get(adapter_id)  # type: ignore[arg-type]
            if adapter is None:
                raise ValidationError(f"Parameter adapter_id must name a loaded LoRA adapter or \"None\", "
                                      f"got {adapter_id!r}")
            adapter.refs += 1
            self._bound[request_id] = adapter
            return adapter.cache_key

    def acquire(self, seq: Sequence) -> bool:
        adapter = self._bound.get(seq.request_id)
        if adapter is None:
            return True
        with self._lock:
            assert self.pool is not None  # an adapter was loaded, so the model has a pool
            if not self.pool.acquire(adapter):
                return False
            seq.adapter_slot = adapter.slot
            return True

    def release(self, seq: Sequence, done: bool) -> None:
        adapter = self._bound.get(seq.request_id)
        if adapter is None:
            return
        with self._lock:
            if seq.adapter_slot and self.pool is not None:
                self.pool.release(adapter)
                seq.adapter_slot = 0
            if done:
                adapter.refs -= 1
                del self._bound[seq.request_id]

    def step_applier(self, seqs: list[Sequence], counts: list[int]) -> BatchedLoraApplier | None:
        """The runner's lora_hook: None (no overhead) when every sequence of the step is on the base model."""
        slots = [s.adapter_slot for s in seqs]
        if not any(slots) or self.pool is None:
            return None
        return build_applier(self.pool, slots, counts)

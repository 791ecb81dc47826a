"""Model instances (BackendConfig.modelInstanceNumber = N): N engines of one model behind one ``EngineClient``.

``InstanceRouter`` sends each request to the instance with the least outstanding work (requests in flight,
then prompt tokens not yet answered, ties taken in turn), except that a session (the /api/* ``request_id``,
``EngineRequest.session_id``) sticks to the instance that holds it: a continuation must reach the engine
whose KV blocks and token record it continues. LoRA adapters loaded at run time are loaded on every
instance. ``healthy()`` is all instances healthy (a dead instance would strand its sessions); ``stats()``
sums them and ``instances()`` gives each one's for /metrics and /v1/status.

On the CPU each instance is an engine thread of the same process, with ``cores // N`` torch threads each
(instance_configs)."""
from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Sequence

from mindie_service.engine.client import EngineClient
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.contract import EngineRequest, EngineStats, PoolRequest, PoolResult, TokenEvent
from mindie_service.fleet.prefix_routing import PrefixRouter
from mindie_service.errors import ConflictError, MindieError
from mindie_service.sampling_params import is_base_adapter

if TYPE_CHECKING:
    from mindie_service.config import ServiceConfig

logger = logging.getLogger(__name__)

# Session -> instance entries kept per instance's max_sessions (an entry outlives its session only until
# pushed out; a continuation whose entry is gone finds no session anywhere and starts afresh).
_OWNER_SLACK = 2


@dataclass(frozen=True)
class InstanceStatus:
    """One instance as /v1/status and /metrics show it. ``routed``/``in_flight`` are None for a lone engine."""

    index: int
    healthy: bool
    stats: EngineStats
    routed: int | None = None  # requests sent to it since start
    in_flight: int | None = None  # requests it is answering now (router's count)


@dataclass
class _Load:
    in_flight: int = 0
    pending_tokens: int = 0  # prompt tokens of requests that have not had their first token yet
    routed: int = 0


def instances_of(engine: EngineClient) -> list[InstanceStatus]:
    """Each instance of ``engine`` (a lone engine is instance 0)."""
    if isinstance(engine, InstanceRouter):
        return engine.instances()
    return [InstanceStatus(0, engine.healthy(), engine.stats())]


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def split_threads(base: EngineConfig, n: int, cores: int | None = None) -> EngineConfig:
    """An instance's config when ``n`` instances share this host's cores: ``cores // n`` torch threads each
    unless numThreads is set. Each engine thread applies it to its own OpenMP team (torch initialises a
    thread's team from the process setting on the thread's first op), so instances do not oversubscribe."""
    if n <= 1 or base.num_threads:
        return base
    return dataclasses.replace(base, num_threads=max(1, (cores or cpu_cores()) // n))


def instance_configs(config: "ServiceConfig", model_index: int = 0) -> list[EngineConfig]:
    """One EngineConfig per model instance of ModelConfig[model_index] (its device group included, when the
    config can say it: ``engine_config(model_index, instance=i)``)."""
    n = max(1, config.backend.model_instance_number)
    per_instance = "instance" in inspect.signature(config.engine_config).parameters
    return [split_threads(config.engine_config(model_index, instance=i) if per_instance  # type: ignore[call-arg]
                          else config.engine_config(model_index), n) for i in range(n)]


def build_instances(configs: Sequence[EngineConfig], build_one: Callable[[EngineConfig], EngineClient]) -> EngineClient:
    """The engine for a model: one engine, or a router over one per config. A failure shuts down those built."""
    engines: list[EngineClient] = []
    try:
        for ec in configs:
            engines.append(build_one(ec))
    except BaseException:
        for e in engines:
            e.shutdown()
        raise
    return engines[0] if len(engines) == 1 else InstanceRouter(engines)


@dataclass
class _SessionRoutes:
    """Which instance holds each session, and their kept sessions: what input processing reads (SessionTokens).
    Apart from the router so that a processor built from the router's facts never keeps the router alive."""

    stores: list[Any]
    owner: OrderedDict[str, int] = dataclasses.field(default_factory=OrderedDict)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def tokens(self, session_id: str) -> tuple[int, ...] | None:
        with self.lock:
            i = self.owner.get(session_id)
        store = self.stores[i] if i is not None else None
        return store.tokens(session_id) if store is not None else None


class InstanceRouter:
    """An ``EngineClient`` over N engines of the same model (engine/client.py)."""

    def __init__(self, engines: Sequence[EngineClient]) -> None:
        if not engines:
            raise ValueError("InstanceRouter needs at least one engine")
        self.engines = list(engines)
        first = self.engines[0]
        self.model_name, self.vocab_size, self.eos_token_ids = first.model_name, first.vocab_size, first.eos_token_ids
        self.device_type, self.device_reason, self.dtype = first.device_type, first.device_reason, first.dtype
        self.modalities = first.modalities
        self.tasks, self.pooling_info = first.tasks, first.pooling_info
        self.weights_report = dict(getattr(first, "weights_report", None) or {})
        # The first instance's input facts (same model, config and adapters on every instance), reading sessions
        # through the router's table so a continuation finds its tokens on whichever instance holds them.
        self._routes = _SessionRoutes([e.input_facts.sessions for e in self.engines])
        self.input_facts = dataclasses.replace(
            first.input_facts, sessions=self._routes if any(s is not None for s in self._routes.stores) else None)
        self._load = [_Load() for _ in self.engines]
        self._lock = self._routes.lock  # tokens() runs in the tokenizer pool; the rest on the IO loop
        self._owner = self._routes.owner  # session key -> instance, least recent first
        self._max_owners = _OWNER_SLACK * sum(max(1, getattr(getattr(e, "config", None), "max_sessions", 1024))
                                              for e in self.engines)
        self._requests: dict[str, int] = {}  # request id in flight -> instance
        self._adapter_use: dict[str, int] = {}  # adapter name -> requests in flight using it
        self._turn = 0  # ties go to instances in turn
        self.prefix: PrefixRouter | None = None  # BackendConfig.instanceRouting "prefix" (fleet.prefix_routing)

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        for e in self.engines:
            e.start()

    def shutdown(self) -> None:
        for e in self.engines:
            e.shutdown()

    def healthy(self) -> bool:
        return all(e.healthy() for e in self.engines)

    @property
    def dead_reason(self) -> str | None:
        """Why the router is unhealthy: the first instance that is not serving."""
        for i, e in enumerate(self.engines):
            if not e.healthy():
                return f"instance {i}: {getattr(e, 'dead_reason', None) or 'not serving'}"
        return None

    def stats(self) -> EngineStats:
        return sum_stats([e.stats() for e in self.engines])

    def instances(self) -> list[InstanceStatus]:
        return [InstanceStatus(i, e.healthy(), e.stats(), routed=ld.routed, in_flight=ld.in_flight)
                for i, (e, ld) in enumerate(zip(self.engines, self._load))]

    def tokenize(self, text: str) -> list[int]:
        return self.engines[0].tokenize(text)

    def detokenize(self, token_ids: list[int]) -> str:
        return self.engines[0].detokenize(token_ids)

    # ------------------------------------------------------------ sessions (SessionLookup)
    def owner_of(self, session_id: str) -> int | None:
        with self._lock:
            return self._owner.get(session_id)

    def tokens(self, session_id: str) -> tuple[int, ...] | None:
        """The kept session's tokens, from the instance that holds it (the input processor asks)."""
        return self._routes.tokens(session_id)

    # ------------------------------------------------------------ routing
    def choose(self, request: EngineRequest) -> int:
        """The instance for ``request``: a continuation's owner, else the least outstanding work."""
        sid = request.session_id
        with self._lock:
            if sid is not None and request.continued and sid in self._owner:
                self._owner.move_to_end(sid)
                return self._owner[sid]
            healthy, best = self._least_loaded()
            if self.prefix is not None:  # the longest cached prefix, unless much more loaded
                best = self.prefix.choose(request, healthy, [ld.in_flight for ld in self._load], best).instance
            self._turn = (best + 1) % len(self.engines)
            if sid is not None:  # a new generation under this key: its session will live where it runs
                self._owner[sid] = best
                self._owner.move_to_end(sid)
                while len(self._owner) > self._max_owners:
                    self._owner.popitem(last=False)
            return best

    def _least_loaded(self) -> tuple[list[int], int]:
        """The healthy instances (all, if none is) in turn order, and the one with the least outstanding work."""
        n = len(self.engines)
        order = [(self._turn + k) % n for k in range(n)]
        healthy = [i for i in order if self.engines[i].healthy()] or order
        return healthy, min(healthy, key=lambda i: (self._load[i].in_flight, self._load[i].pending_tokens))

    async def generate(self, request: EngineRequest) -> AsyncIterator[TokenEvent]:
        i = self.choose(request)
        ld, rid, adapter = self._load[i], request.request_id, request.params.adapter_id
        prompt = len(request.prompt_token_ids)
        ld.in_flight += 1
        ld.pending_tokens += prompt
        ld.routed += 1
        self._requests[rid] = i
        use = not is_base_adapter(adapter)
        if use:
            self._adapter_use[adapter] = self._adapter_use.get(adapter, 0) + 1  # type: ignore[index]
        logger.debug("%s -> instance %d", rid, i)
        agen = self.engines[i].generate(request)
        try:
            async for ev in agen:
                if prompt:
                    ld.pending_tokens -= prompt
                    prompt = 0
                yield ev
        finally:
            await agen.aclose()
            ld.in_flight -= 1
            ld.pending_tokens -= prompt
            self._requests.pop(rid, None)
            if use:
                left = self._adapter_use[adapter] - 1  # type: ignore[index]
                if left:
                    self._adapter_use[adapter] = left  # type: ignore[index]
                else:
                    del self._adapter_use[adapter]  # type: ignore[arg-type]

    async def pool(self, request: PoolRequest) -> PoolResult:
        """On the instance with the least outstanding work (its prompt tokens counted while it runs)."""
        with self._lock:
            _, i = self._least_loaded()
            self._turn = (i + 1) % len(self.engines)
        ld = self._load[i]
        tokens = sum(len(x) for x in request.inputs)
        ld.in_flight += 1
        ld.pending_tokens += tokens
        ld.routed += 1
        try:
            return await self.engines[i].pool(request)
        finally:
            ld.in_flight -= 1
            ld.pending_tokens -= tokens

    def abort(self, request_id: str) -> None:
        i = self._requests.get(request_id)
        for e in self.engines if i is None else [self.engines[i]]:
            e.abort(request_id)

    # ------------------------------------------------------------ LoRA adapters: on every instance
    async def load_adapter(self, name: str, path: str) -> dict[str, Any]:
        results = await asyncio.gather(*(e.load_adapter(name, path) for e in self.engines), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:  # all or none: take it off the instances that took it
            for e, r in zip(self.engines, results):
                if not isinstance(r, BaseException):
                    try:
                        e.unload_adapter(name)
                    except MindieError:
                        logger.warning("adapter %s: rollback on one instance failed", name)
            raise failed[0]
        return results[0]  # type: ignore[return-value]

    def unload_adapter(self, name: str) -> None:
        """All or none: refused (409) while any instance has a request using it."""
        busy = self._adapter_use.get(name, 0)
        if busy:
            raise ConflictError(f"LoRA adapter {name!r} is in use by {busy} request(s); "
                                f"unload it when they have finished")
        self.engines[0].unload_adapter(name)  # NotFoundError (404) when unknown
        for i, e in enumerate(self.engines[1:], 1):
            try:
                e.unload_adapter(name)
            except MindieError as exc:  # the instances disagree: report, keep going
                logger.warning("adapter %s: unload on instance %d: %s", name, i, exc)

    def list_adapters(self) -> list[dict[str, Any]]:
        rows = self.engines[0].list_adapters()
        in_use: dict[str, int] = {}
        for e in self.engines:
            for row in e.list_adapters():
                in_use[row["name"]] = in_use.get(row["name"], 0) + int(row.get("in_use") or 0)
        return [{**row, "in_use": in_use.get(row["name"], 0)} if "in_use" in row else row for row in rows]

    def adapter_names(self) -> list[str]:
        return self.engines[0].adapter_names()


# EngineStats fields that are one instance's (the cache's shape) and sets over the instances (adapters).
_SHAPE = ("block_size", "max_loras", "kv_cache_dtype", "prefix_caching")
_ADAPTERS = ("running_adapters", "waiting_adapters")


def sum_stats(parts: Sequence[EngineStats]) -> EngineStats:
    """The instances' stats as one engine's: counts summed, usage over all blocks, rates averaged."""
    total = sum(s.total_blocks for s in parts)
    free = sum(s.free_blocks for s in parts)
    first = parts[0]
    summed = {f.name: sum(getattr(s, f.name) for s in parts) for f in dataclasses.fields(EngineStats)
              if f.name not in _SHAPE and f.name not in _ADAPTERS}
    summed |= {name: getattr(first, name) for name in _SHAPE}  # every instance has the same shape
    summed |= {name: tuple(sorted({a for s in parts for a in getattr(s, name)})) for name in _ADAPTERS}
    summed["cache_usage"] = (total - free) / total if total else 0.0
    summed["prefix_cache_hit_rate"] = sum(s.prefix_cache_hit_rate for s in parts) / len(parts)
    return EngineStats(**summed)

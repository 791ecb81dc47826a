"""Which catalog models are loaded: a request naming a stopped model loads it (one load per model, shared by every
request waiting for it), a load that would not fit ``maxLoadedModels`` or ``modelMemoryBudget`` first unloads idle
models, least recently used first, and idle models unload after their ``keep_alive`` or ``idleUnloadSeconds``.

A model with requests in flight (held through the catalog, or with sequences in its engine) is never unloaded. A
failed load is the model's state: its requests get its ``load_error`` (424) until the management port starts it
again, never a retry per request. One load (and its making room) runs at a time, so each load's memory is
measured apart from any other (catalog/memory_meter.py) and the fit check sees one change at a time."""
from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Callable

from mindie_service.catalog.catalog import Catalog, Target
from mindie_service.catalog.entry import CatalogEntry
from mindie_service.catalog.memory_meter import total_memory as memory_total
from mindie_service.catalog.sleep import wake_pool
from mindie_service.catalog.residency_stats import MeasuredMemory
from mindie_service.catalog.residency_policy import ResidencyPolicy, budget_bytes, idle_seconds
from mindie_service.errors import MindieError, ModelLoadError, OverloadedError, UnhealthyError, ValidationError

logger = logging.getLogger(__name__)

POLL_S = 0.02  # how often a waiter looks again (a stop draining, a held model being released)
REAP_S = 0.1  # how often idle models are checked against their keep_alive / idleUnloadSeconds
LOADABLE = ("stopped", "downloaded", "sleeping")


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


class Residency:
    """One per process, beside the catalog; ``acquire`` is the door every route's model lookup goes through."""

    def __init__(self, catalog: Catalog, policy: ResidencyPolicy,
                 total_memory: Callable[[], int] | None = None) -> None:
        self.catalog, self.policy = catalog, policy
        self.budget = None if policy.budget is None else budget_bytes(policy.budget, total_memory or memory_total)
        self._loads: dict[str, asyncio.Task[None]] = {}
        self._no_room: dict[str, str] = {}  # model -> why it does not fit yet, while its load waits for room
        self._lock = asyncio.Lock()  # one load (and its making room) at a time
        self._reaper: asyncio.Task[None] | None = None
        # What loads here measured beyond their header estimate at most (the tokenizer, the model's objects, heap the
        # load left): an unmeasured model's estimate leaves it out, so its fit check adds it. And each model's
        # highest measurement: a load measures a little more or less each time (requests on other models run beside it).
        self.beyond_estimate = 0
        self._highest: dict[str, tuple[int, int]] = {}  # model -> (most it stayed at, most its load peaked at)
        catalog.on_release = self._released

    # -- the door --------------------------------------------------------------------------------------------------
    async def acquire(self, name: str, keep_alive: float | None = None, *, loads: bool = True) -> Target:
        """The model (or adapter) ``name`` names, running and held (``catalog.release`` after): loaded first when it
        is stopped, asleep or starting, within modelLoadTimeoutSeconds. 404 unknown; 424 its load failed; 429 no
        room within the bound; 503 not loadable here (``loads`` false, or not allowed) or still loading at the bound."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        deadline = t0 + self.policy.load_timeout_s
        waited = False
        while True:
            try:
                target = self.catalog.resolve(name)
            except UnhealthyError as refused:
                e = self.catalog.entries.get(name)
                if e is None:
                    raise
                self._check_loadable(e, refused, loads)
                if waited and loop.time() >= deadline:
                    raise self._timeout(e) from None
                waited = True
                e.waiting += 1  # (the resolve after the load runs before any other task: nothing evicts it between)
                try:
                    await self._bring_up(e, deadline)
                finally:
                    e.waiting -= 1
                continue
            self._touch(target.entry, keep_alive)
            if waited:
                target.entry.counters.load_waits += 1
                logger.info("model %s: a request waited %.2f s for its load", target.entry.id, loop.time() - t0)
            return target

    def _check_loadable(self, e: CatalogEntry, refused: UnhealthyError, loads: bool) -> None:
        if e.state == "failed":
            raise ModelLoadError(f"model {e.id} failed to load: {e.error} (it is not loaded again for each request: "
                                 f"once the cause is gone, PUT /v1/models/{e.id}/start on the management port)")
        if e.state not in LOADABLE + ("starting", "stopping"):
            raise refused  # not downloaded, downloading, or running with a dead engine
        if e.state in LOADABLE + ("stopping",) and not (loads and self.policy.may_load(e.id)):
            raise UnhealthyError(f"{refused.message}; {self.policy.why_not(e.id)}")

    def _timeout(self, e: CatalogEntry) -> UnhealthyError:
        return UnhealthyError(f"model {e.id} is not loaded after {self.policy.load_timeout_s:g} s "
                              f"(ServerConfig.modelLoadTimeoutSeconds; state: {e.state}); retry later")

    async def bring_up(self, e: CatalogEntry) -> None:
        """Load (or wake) ``e`` now, within modelLoadTimeoutSeconds, room made as for a request (the management
        port's wake_up)."""
        await self._bring_up(e, asyncio.get_running_loop().time() + self.policy.load_timeout_s)

    async def _bring_up(self, e: CatalogEntry, deadline: float) -> None:
        """Wait (until ``deadline``) for ``e``'s one load, starting it when none runs."""
        task = self._task(e, deadline)
        left = deadline - asyncio.get_running_loop().time()
        try:
            await asyncio.wait_for(asyncio.shield(task), max(left, 0.0))
        except asyncio.TimeoutError:
            why = self._no_room.get(e.id)
            if why is None and e.state in LOADABLE:  # its load never began: queued behind other models' loads
                why = "loads run one at a time and other models' loads were ahead of it"
            if why is not None:  # waiting for room (or its turn), not loading: capacity is the answer
                raise self._overloaded(e, why) from None
            raise self._timeout(e) from None

    def _task(self, e: CatalogEntry, deadline: float) -> asyncio.Task[None]:
        """``e``'s one load task, begun when none runs (its error is each waiter's; none left unread)."""
        task = self._loads.get(e.id)
        if task is None:
            task = self._loads[e.id] = asyncio.ensure_future(self._load(e, deadline))

            def done(t: asyncio.Task[None], mid: str = e.id) -> None:
                self._loads.pop(mid, None)
                if not t.cancelled() and t.exception() is not None:
                    logger.info("model %s: not loaded: %s", mid, t.exception())
            task.add_done_callback(done)
        return task

    async def start_requested(self, e: CatalogEntry) -> None:
        """The management port's start: room made as for a request (429 naming the budget when none frees up
        within modelLoadTimeoutSeconds), then it answers once the load has begun (the route answers at once)."""
        if e.state in ("running", "starting") or e.state not in LOADABLE + ("failed", "stopping"):
            self.catalog.start(e.id)  # (running: nothing; not downloaded, downloading: its 409)
            return
        if e.state == "failed":
            e.state = "stopped"  # a start once the cause is gone: loaded again, room made first
        task = self._task(e, asyncio.get_running_loop().time() + self.policy.load_timeout_s)
        while not task.done() and e.state != "starting":
            await asyncio.sleep(POLL_S)
        if task.done():
            task.result()  # its 409 / 429, else nothing

    def _overloaded(self, e: CatalogEntry, why: str) -> OverloadedError:
        return OverloadedError(f"model {e.id} cannot be loaded now: {why}, and every loaded model has requests in "
                               f"flight (waited {self.policy.load_timeout_s:g} s, ServerConfig.modelLoadTimeoutSeconds);"
                               " retry later")

    async def _load(self, e: CatalogEntry, deadline: float) -> None:
        async with self._lock:
            await self._settled(e)  # a stop (or a management start) under way ends first
            if e.state not in LOADABLE:
                return
            await self._make_room(e, deadline)
            if e.state == "sleeping" and e.sleep_level == 1 and e.engine is not None:
                await wake_pool(e)  # its weights stayed: a fresh KV pool is all it needs
                return
            if e.state == "sleeping":  # level 2: nothing of it is loaded
                e.state, e.sleep_level = "stopped", 0
            logger.info("model %s: %s -> starting (requested)", e.id, e.state)
            try:
                self.catalog.start(e.id)  # a MindieError (409: does not fit the memory left) is the request's answer
            except MindieError:
                raise
            except Exception as ex:  # noqa: BLE001 - anything else is the model's failed load, not a 500
                logger.exception("model %s: its start failed", e.id)
                e.state, e.error = "failed", f"{type(ex).__name__}: {ex}"
            await self._settled(e)
            if e.state == "running":
                e.counters.loaded(e.last_load_s or 0.0)
                self._learn(e)
            else:
                e.counters.load_failures += 1

    async def _settled(self, e: CatalogEntry) -> None:
        while e.state in ("starting", "stopping"):
            await asyncio.sleep(POLL_S)

    # -- room ------------------------------------------------------------------------------------------------------
    def resident(self, e: CatalogEntry) -> bool:
        """Holds memory now: loading, running, stopping (until its engine is gone), asleep at level 1 (weights)."""
        return e.state in ("starting", "running", "stopping") or (e.state == "sleeping" and e.sleep_level == 1)

    def held_bytes(self, e: CatalogEntry) -> int:
        """What ``e`` takes while resident: its highest measured footprint when known (while it loads, what its
        load takes at its peak), else the estimate."""
        m = self.measured(e)
        if m is None or e.state == "starting":
            return self.need_bytes(e)
        return m.weights if e.state == "sleeping" else max(m.total, self._highest.get(e.id, (0, 0))[0])

    def need_bytes(self, e: CatalogEntry) -> int:
        """What loading ``e`` takes at its highest: the most its measured loads took at their peak, else its header
        estimate plus the most measured loads here took beyond theirs (a mock's estimate, 0, stays 0)."""
        m = self.measured(e)
        if m is not None:
            return max(m.load_need, self._highest.get(e.id, (0, 0))[1])
        est = self.catalog.need_bytes(e)
        return est + self.beyond_estimate if est else 0

    def _learn(self, e: CatalogEntry) -> None:
        """A load measured: keep the most it stayed at and peaked at, and how far its estimate fell short."""
        m = self.measured(e)
        if m is None:
            return
        total, need = self._highest.get(e.id, (0, 0))
        self._highest[e.id] = (max(total, m.total), max(need, m.load_need))
        est = self.catalog.need_bytes(e)
        if est and m.load_need - est > self.beyond_estimate:
            self.beyond_estimate = m.load_need - est
            logger.info("model %s: measured %s, %s beyond its header estimate: unmeasured models' fit checks count "
                        "that much more", e.id, gib(m.total), gib(self.beyond_estimate))

    @staticmethod
    def measured(e: CatalogEntry) -> MeasuredMemory | None:
        """``e``'s measurement when it is its own (not the process's first load, which paid the runtime's start)."""
        return e.memory if e.memory is not None and not e.memory.includes_runtime_start else None

    def no_room(self, e: CatalogEntry) -> str | None:
        """Why ``e`` would not fit now beside the resident models without unloading one (None: it fits)."""
        others = [x for x in self.catalog.entries.values() if x is not e and self.resident(x)]
        return self._full(e, others, self.need_bytes(e))

    def _full(self, e: CatalogEntry, others: list[CatalogEntry], need: int) -> str | None:
        """Why ``e`` does not fit beside ``others`` (None: it fits)."""
        if self.policy.max_loaded is not None and len(others) >= self.policy.max_loaded:
            return f"maxLoadedModels = {self.policy.max_loaded} models are loaded"
        used = sum(self.held_bytes(x) for x in others)
        if self.budget is not None and used + need > self.budget:
            return (f"modelMemoryBudget = {self.policy.budget} ({gib(self.budget)}) holds {gib(used)} of loaded "
                    f"models and model {e.id} needs {gib(need)}")
        return None

    def idle(self, e: CatalogEntry) -> bool:
        """Running with no request held or waiting for it, and nothing in its engine (a batch job's lines count)."""
        if e.state != "running" or e.active > 0 or e.waiting > 0 or e.engine is None:
            return False
        st = e.engine.stats()
        return st.running + st.waiting + st.swapped == 0

    async def _make_room(self, e: CatalogEntry, deadline: float) -> None:
        """Unload idle models, least recently used first, until ``e`` fits; 429 naming the budget when nothing can
        go before ``deadline`` (at once when ``e`` alone is over the budget)."""
        need = self.need_bytes(e)
        if self.budget is not None and need > self.budget:
            raise OverloadedError(f"model {e.id} needs {gib(need)}, more than modelMemoryBudget = "
                                  f"{self.policy.budget} ({gib(self.budget)}) allows")
        loop = asyncio.get_running_loop()
        try:
            while True:
                others = [x for x in self.catalog.entries.values() if x is not e and self.resident(x)]
                why = self._full(e, others, need)
                if why is None:
                    return
                idle = [x for x in others if self.idle(x)]
                if idle:
                    victim = min(idle, key=lambda x: x.last_used or 0.0)
                    reason = "max_loaded" if why.startswith("maxLoadedModels") else "budget"
                    await self.unload(victim, reason, f"evicted for {e.id}: {why}")
                    continue
                self._no_room[e.id] = why
                if loop.time() >= deadline:
                    raise self._overloaded(e, why)
                await asyncio.sleep(POLL_S)
        finally:
            self._no_room.pop(e.id, None)

    async def unload(self, e: CatalogEntry, reason: str, why: str) -> None:
        """Stop ``e`` (its held requests finish first) and count why; it loads again on the next request."""
        if e.state != "running":
            return
        logger.info("model %s: running -> stopping (%s)", e.id, why)
        self.catalog.stop(e.id)
        e.parked = reason != "requested"
        e.counters.unloaded(reason)
        await self._settled(e)

    # -- idle models -----------------------------------------------------------------------------------------------
    def _touch(self, e: CatalogEntry, keep_alive: float | None) -> None:
        e.last_used = time.time()
        e.keep_alive_s = keep_alive

    def _released(self, e: CatalogEntry) -> None:
        """The catalog let go of a request's hold (any thread): idleness counts from here."""
        e.idle_since = time.monotonic()

    def keep_seconds(self, e: CatalogEntry) -> tuple[float | None, str]:
        """How long ``e`` stays loaded once idle, and which rule says so (None: until evicted or stopped)."""
        if e.keep_alive_s is not None:
            return (None if math.isinf(e.keep_alive_s) else e.keep_alive_s), "keep_alive"
        try:
            return idle_seconds(e.record.engine_parameters, self.policy.idle_unload_s), "idle"
        except ValidationError as ex:
            logger.warning("model %s: %s; it is not unloaded when idle", e.id, ex.message)
            return None, "idle"

    async def reap_once(self) -> None:
        now = time.monotonic()
        for e in list(self.catalog.entries.values()):
            if not self.idle(e):
                continue
            secs, rule = self.keep_seconds(e)
            since = e.idle_since if e.idle_since is not None else now
            if secs is not None and now - since >= secs:
                what = f"keep_alive {secs:g} s" if rule == "keep_alive" else f"idleUnloadSeconds = {secs:g}"
                await self.unload(e, rule, f"idle for {now - since:.1f} s ({what})")

    def start(self) -> None:
        """Begin unloading idle models (on the IO loop)."""
        if self._reaper is None:
            self._reaper = asyncio.ensure_future(self._reap())

    async def _reap(self) -> None:
        while True:
            try:
                await self.reap_once()
            except Exception:  # noqa: BLE001 - the reaper must outlive one bad model
                logger.exception("idle-unload check failed")
            await asyncio.sleep(REAP_S)

    async def shutdown(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None
        for t in list(self._loads.values()):
            t.cancel()

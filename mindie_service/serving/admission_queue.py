"""MindIE's admission rule, the serving core's gate in front of the engine: ``maxLinkNum`` requests run (are
admitted to the engine); up to ``2 x maxLinkNum`` more wait here and are admitted as slots free; beyond that a
request is refused at once (429 ``overloaded``).

The queue follows the scheduler's order (engine.sched.order): the request priority (``rank``, lower first,
0 by default: params.priority maps each dialect's field onto it), then arrival. No waiter starves: one that
has waited ``aging_s`` (order.AGING_S) goes before every younger one, whatever their ranks.

A request may take ``n`` slots at once (an /api/generate-batch call counts one per prompt). Fairness is
strict: nobody passes the head of the queue, so a waiter for several slots is not starved by single ones
arriving after it. A waiter that gives up (its deadline passed, its client left: its task is cancelled)
leaves the queue, and the ones behind it move up."""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from mindie_service.engine.sched.order import AGING_S
from mindie_service.errors import OverloadedError

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _Waiter:
    n: int
    rank: int  # the request priority, lower first
    arrival: float  # the queue's clock when it queued
    seq: int  # arrival order (ties of the clock)
    future: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class AdmissionQueue:
    """``max_running`` slots and a queue of at most ``max_waiting`` requests, in priority then arrival order;
    ``clock`` (seconds) ages the waiters."""

    def __init__(self, max_running: int, max_waiting: int | None = None, *, aging_s: float = AGING_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_running < 1:
            raise ValueError("max_running must be at least 1")
        self.max_running = max_running
        self.max_waiting = 2 * max_running if max_waiting is None else max_waiting
        self.running = 0  # slots held by admitted requests
        self.waiting = 0  # slots asked for by the queued requests
        self.aging_s, self.clock = aging_s, clock
        self._queue: list[_Waiter] = []
        self._arrivals = itertools.count()
        self.idle = asyncio.Event()  # set while nothing runs and nothing waits (the drain waits for it)
        self.idle.set()

    @property
    def full(self) -> bool:
        """No room left in the queue: the next request that cannot run at once is refused."""
        return self.waiting >= self.max_waiting

    async def acquire(self, n: int = 1, timeout: float | None = None, rank: int = 0) -> None:
        """Take ``n`` slots at priority ``rank``: at once when nobody waits and they are free, else after
        queueing. Raises
        OverloadedError (at once) when ``n`` exceeds every slot or the queue has no room for ``n`` more,
        TimeoutError when ``timeout`` seconds pass in the queue (the waiter has left it then)."""
        if n > self.max_running:
            raise OverloadedError(f"this call needs {n} generation slots, more than ServerConfig.maxLinkNum = "
                                  f"{self.max_running}: send at most {self.max_running} prompts per call")
        if not self._queue and self.running + n <= self.max_running:
            self._take(n)
            return
        if self.waiting + n > self.max_waiting:
            raise OverloadedError(f"Model is overloaded: {self.running} requests running and {self.waiting} "
                                  f"waiting (ServerConfig.maxLinkNum = {self.max_running}: that many run, "
                                  f"{self.max_waiting} more may wait)")
        w = _Waiter(n, rank, self.clock(), next(self._arrivals))
        self._queue.append(w)
        self.waiting += n
        self.idle.clear()
        try:
            async with asyncio.timeout(timeout):
                await w.future
        except BaseException:
            if w.future.done() and not w.future.cancelled():
                self.release(n)  # granted as the wait ended: hand the slots on
            elif w in self._queue:
                self._queue.remove(w)
                self.waiting -= n
                self._grant()  # the head may have left: the next ones may fit now
                self._check_idle()
            raise

    def release(self, n: int = 1) -> None:
        """Give back ``n`` slots of an admitted request; the queue's head is admitted as they fit."""
        self.running -= n
        if self.running < 0:
            raise RuntimeError("released more admission slots than were taken")
        self._grant()
        self._check_idle()

    def _take(self, n: int) -> None:
        self.running += n
        self.idle.clear()

    def _head(self) -> _Waiter:
        """The next to admit: the oldest waiter that has waited aging_s, else the most urgent, oldest one."""
        now = self.clock()
        return min(self._queue, key=lambda w: (0, 0, w.seq) if now - w.arrival >= self.aging_s else (1, w.rank, w.seq))

    def _grant(self) -> None:
        while self._queue:
            w = self._head()
            if w.future.done():  # cancelled; its task has not run its cleanup yet
                self._queue.remove(w)
                self.waiting -= w.n
                continue
            if self.running + w.n > self.max_running:
                return  # nobody passes the head
            self._queue.remove(w)
            self.waiting -= w.n
            self._take(w.n)
            w.future.set_result(None)

    def _check_idle(self) -> None:
        if self.running == 0 and self.waiting == 0:
            self.idle.set()

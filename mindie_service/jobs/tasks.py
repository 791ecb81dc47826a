"""The task bookkeeping both batch runners share (jobs.runner's llama-stack jobs, jobs.batch_runner's OpenAI
batches): one task per job, started once, cancelled on request or at shutdown (``TaskTable``); and a job's work
items run as tasks bounded by the shared batch slots, each slot given back by the task's
done-callback, so a task cancelled before it first ran gives its slot back too (``SlotTasks``)."""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Coroutine


class TaskTable:
    """At most one running task per key; a finished task leaves the table by itself."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix  # the tasks' names: f"{prefix}-{key}"
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, key: str, make: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``make()`` as ``key``'s task unless one runs already."""
        if key not in self._tasks:
            task = asyncio.get_running_loop().create_task(make(), name=f"{self.prefix}-{key}")
            self._tasks[key] = task
            task.add_done_callback(lambda _t: self._tasks.pop(key, None))

    async def stop(self, key: str) -> None:
        """Cancel ``key``'s task (when one runs) and wait until it has ended."""
        task = self._tasks.get(key)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def shutdown(self) -> None:
        """Cancel every task and wait for them all."""
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class SlotTasks:
    """A job's work items, each run as a task once one of the shared ``slots`` is free (``spawn``). Leaving the
    ``async with`` waits for them all; an error or a cancellation there cancels those still running and waits for
    them, so no task outlives its job."""

    def __init__(self, slots: asyncio.Semaphore) -> None:
        self.slots = slots
        self._pending: set[asyncio.Future[None]] = set()

    async def spawn(self, fn: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> "asyncio.Future[None]":
        """Wait for a slot, then run ``fn(*args)`` as a task holding it (made only once the slot is held)."""
        await self.slots.acquire()
        t = asyncio.ensure_future(fn(*args))
        self._pending.add(t)
        t.add_done_callback(self._pending.discard)
        t.add_done_callback(lambda _t: self.slots.release())  # also for a task cancelled before it ran
        return t

    async def __aenter__(self) -> "SlotTasks":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if exc_type is None and self._pending:
                await asyncio.gather(*self._pending)
        finally:
            for t in self._pending:
                t.cancel()
            await asyncio.gather(*self._pending, return_exceptions=True)

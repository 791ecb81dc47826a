"""Issue 15, MindIE's admission rule (serving/admission_queue.py): maxLinkNum run, 2 x maxLinkNum wait first come
first served, the next is refused at once; waiters that time out or are cancelled leave the queue."""
from __future__ import annotations

import asyncio

import pytest

from mindie_service.errors import OverloadedError
from mindie_service.serving.admission_queue import AdmissionQueue


def run(coro):
    return asyncio.run(coro)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_max_running_run_twice_as_many_wait_and_the_next_is_refused_at_once():
    async def main():
        q = AdmissionQueue(2)
        await q.acquire()
        await q.acquire()
        assert (q.running, q.waiting, q.full) == (2, 0, False)
        waiters = [asyncio.ensure_future(q.acquire()) for _ in range(4)]
        await settle()
        assert (q.running, q.waiting, q.full) == (2, 4, True)
        assert not any(w.done() for w in waiters)
        with pytest.raises(OverloadedError, match="maxLinkNum = 2"):
            await q.acquire()  # refused without waiting
        q.release()
        await settle()
        assert [w.done() for w in waiters] == [True, False, False, False]  # the first in line, only
        assert (q.running, q.waiting, q.full) == (2, 3, False)
        for _ in range(5):
            q.release()
            await settle()
        assert all(w.done() for w in waiters)
        assert (q.running, q.waiting) == (0, 0) and q.idle.is_set()
    run(main())


def test_waiters_are_served_in_arrival_order():
    async def main():
        q = AdmissionQueue(1, max_waiting=10)
        await q.acquire()
        order: list[int] = []

        async def waiter(i: int) -> None:
            await q.acquire()
            order.append(i)

        tasks = []
        for i in range(6):
            tasks.append(asyncio.ensure_future(waiter(i)))
            await asyncio.sleep(0)  # arrive one after another
        for _ in range(7):
            q.release()
            await settle()
        await asyncio.gather(*tasks)
        assert order == list(range(6))
    run(main())


def test_a_waiter_for_several_slots_is_not_passed_by_later_single_ones():
    async def main():
        q = AdmissionQueue(3)
        await q.acquire(2)
        await q.acquire(1)
        big = asyncio.ensure_future(q.acquire(3))
        await settle()
        small = asyncio.ensure_future(q.acquire(1))
        await settle()
        q.release(1)  # one slot is free: the small waiter would fit, but the big one came first
        await settle()
        assert not big.done() and not small.done() and q.running == 2
        q.release(2)
        await settle()
        assert big.done() and not small.done() and q.running == 3
        q.release(3)
        await settle()
        assert small.done() and q.running == 1
    run(main())


def test_more_slots_than_exist_are_refused_with_the_reason():
    async def main():
        q = AdmissionQueue(3)
        with pytest.raises(OverloadedError, match="needs 4 generation slots.*at most 3 prompts"):
            await q.acquire(4)
        assert (q.running, q.waiting) == (0, 0)
    run(main())


def test_a_waiter_whose_deadline_passes_leaves_the_queue():
    async def main():
        q = AdmissionQueue(1)
        await q.acquire()
        late = asyncio.ensure_future(q.acquire(timeout=0.05))
        behind = asyncio.ensure_future(q.acquire())
        with pytest.raises(TimeoutError):
            await late
        assert q.waiting == 1  # only the one behind it waits now
        q.release()
        await settle()
        assert behind.done() and q.running == 1
    run(main())


def test_a_cancelled_waiter_leaves_the_queue_and_lets_the_next_in():
    async def main():
        q = AdmissionQueue(2)
        await q.acquire(2)
        first = asyncio.ensure_future(q.acquire(2))
        second = asyncio.ensure_future(q.acquire(1))
        await settle()
        assert q.waiting == 3
        q.release(1)  # one slot free: the head (2 slots) does not fit, the second must not pass it
        await settle()
        assert not second.done()
        first.cancel()  # its client left
        await settle()
        assert second.done() and (q.running, q.waiting) == (2, 0)
    run(main())


def test_slots_granted_as_the_waiter_is_cancelled_are_handed_on():
    async def main():
        q = AdmissionQueue(1)
        await q.acquire()
        w = asyncio.ensure_future(q.acquire())
        nxt = asyncio.ensure_future(q.acquire())
        await settle()
        q.release()  # grants w's future ...
        w.cancel()  # ... and w's task is cancelled before it resumes
        await settle()
        assert w.cancelled()
        assert nxt.done() and q.running == 1  # its slot went on to the next in line, none leaked
        q.release()
        await settle()
        assert (q.running, q.waiting) == (0, 0) and q.idle.is_set()
    run(main())

"""The gateway's fair share of a backend: never more at once than its capacity, the next place to the
grant with the fewest requests at the backend, and a cancelled waiter gives back what it was handed."""

from __future__ import annotations

import asyncio

import pytest

from openrebench.gateway._fair import FairQueue


def test_the_capacity_is_never_exceeded_and_a_second_owner_is_served_between_a_floods_requests() -> None:
    async def main() -> list[str]:
        queue, order, most = FairQueue(2), [], 0

        async def one(owner: str) -> None:
            nonlocal most
            async with queue.slot(owner):
                most = max(most, queue.active)
                order.append(owner)
                await asyncio.sleep(0.01)

        hog = [asyncio.create_task(one("hog")) for _ in range(10)]
        await asyncio.sleep(0)  # the flood is queued first
        victim = asyncio.create_task(one("victim"))
        await asyncio.gather(*hog, victim)
        assert most == 2 and queue.active == 0 and queue.waiting == 0
        return order

    order = asyncio.run(main())
    # Two of the hog's at once; the victim's goes at the first place that frees, not after all ten.
    assert order.index("victim") == 2, order


def test_waiters_of_equal_standing_are_served_in_arrival_order() -> None:
    async def main() -> list[int]:
        queue, order = FairQueue(1), []

        async def one(owner: str, i: int) -> None:
            async with queue.slot(owner):
                order.append(i)
                await asyncio.sleep(0)

        await asyncio.gather(*(one(f"o{i}", i) for i in range(6)))
        return order

    assert asyncio.run(main()) == list(range(6))


def test_a_cancelled_waiter_leaves_no_place_taken() -> None:
    async def main() -> None:
        queue = FairQueue(1)
        release = asyncio.Event()

        async def hold() -> None:
            async with queue.slot("a"):
                await release.wait()

        holder = asyncio.create_task(hold())
        await asyncio.sleep(0)
        waiter = asyncio.create_task(queue.slot("b").__aenter__())
        await asyncio.sleep(0)
        assert queue.waiting == 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        release.set()
        await holder
        assert queue.active == 0 and queue.waiting == 0
        async with queue.slot("c"):  # the place is free again
            assert queue.active == 1

    asyncio.run(main())


def test_a_capacity_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        FairQueue(0)

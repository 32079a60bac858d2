"""Ending a loop (a partition's pull loop, a watch) works even when the loop lets a cancellation go by."""

from __future__ import annotations

import asyncio

from plumbing.tasks import cancel_and_wait


def test_a_loop_that_loses_one_cancellation_is_cancelled_again_and_ends() -> None:
    rounds: list[str] = []

    async def loop_that_misses_a_cancel() -> None:
        # What Python 3.11's asyncio.wait_for does when a cancellation meets its inner wait completing:
        # the cancellation is gone and the loop goes on to its next wait.
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            rounds.append("first cancellation lost")
        await asyncio.sleep(30)

    async def main() -> asyncio.Task[None]:
        task = asyncio.create_task(loop_that_misses_a_cancel())
        await asyncio.sleep(0)
        await asyncio.wait_for(cancel_and_wait(task, every=0.05), timeout=5)
        return task

    task = asyncio.run(main())
    assert rounds == ["first cancellation lost"]
    assert task.cancelled()


def test_a_loop_that_ends_at_once_is_waited_for_once() -> None:
    async def main() -> asyncio.Task[None]:
        task = asyncio.create_task(asyncio.sleep(30))
        await asyncio.sleep(0)
        await asyncio.wait_for(cancel_and_wait(task, every=10), timeout=1)
        return task

    assert asyncio.run(main()).cancelled()

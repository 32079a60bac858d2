"""``plumbing.publishing.await_acks``: every way a wait for PubAcks ends leaves no ack unsettled.

Asyncio reports a future whose exception nobody retrieved when it is collected; the planner logged exactly
that ("_GatheringFuture exception was never retrieved") after a NATS node was killed, when its task was
cancelled while it waited on a gather of its acks.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from plumbing.publishing import await_acks


async def _reported(body: Any) -> list[str]:
    """What asyncio's exception handler was told while ``body`` ran and its futures were collected."""
    loop = asyncio.get_running_loop()
    seen: list[str] = []
    loop.set_exception_handler(lambda _, context: seen.append(context["message"]))
    try:
        await body()
        gc.collect()
        await asyncio.sleep(0)
        gc.collect()
    finally:
        loop.set_exception_handler(None)
    return seen


def _acks(n: int) -> list[asyncio.Future[Any]]:
    loop = asyncio.get_running_loop()
    return [loop.create_future() for _ in range(n)]


async def test_all_acks_in_is_success() -> None:
    """The wait returns once the last ack is in, not before: acks that come one by one, the last well after
    the first, are all still there with their results (a wait that returned early would have cancelled the
    ones still out), and nothing is reported to asyncio."""

    async def body() -> None:
        acks = _acks(3)
        order: list[str] = []

        async def arrive() -> None:
            for index, ack in enumerate(acks):
                await asyncio.sleep(0.05)
                ack.set_result(f"stored {index}")
                order.append(f"ack {index}")

        arriving = asyncio.create_task(arrive())
        await await_acks(acks, timeout=30.0)  # a generous bound; the acks take about 0.15 s
        order.append("returned")
        await arriving
        assert order == ["ack 0", "ack 1", "ack 2", "returned"]
        assert [ack.result() for ack in acks] == ["stored 0", "stored 1", "stored 2"]

    assert await _reported(body) == []


async def test_the_first_error_is_raised_at_once_and_the_others_settled() -> None:
    async def body() -> None:
        acks = _acks(3)
        acks[1].set_exception(ConnectionError("closed"))
        with pytest.raises(ConnectionError, match="closed"):
            await await_acks(acks, timeout=30.0)
        assert acks[0].cancelled() and acks[2].cancelled()

    assert await _reported(body) == []


async def test_acks_still_out_at_the_timeout_are_a_timeout() -> None:
    acks = _acks(2)
    acks[0].set_result("stored")
    with pytest.raises(TimeoutError, match="1 of 2 PubAcks"):
        await await_acks(acks, timeout=0.01)
    assert acks[1].cancelled()


async def test_an_ack_the_client_gave_up_is_not_success() -> None:
    acks = _acks(2)
    acks[0].set_result("stored")
    acks[1].cancel()
    with pytest.raises(ConnectionError, match="given up"):
        await await_acks(acks, timeout=1.0)


async def test_a_cancelled_wait_leaves_nothing_unretrieved() -> None:
    async def body() -> None:
        acks = _acks(3)
        waiting = asyncio.create_task(await_acks(acks, timeout=30.0))
        await asyncio.sleep(0.01)
        acks[0].set_exception(ConnectionError("closed"))  # the same moment the task is cancelled
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert all(ack.done() for ack in acks)

    assert await _reported(body) == []


async def test_gather_under_wait_for_is_what_reported_it() -> None:
    """The shape the planner used, cancelled the same way: asyncio reports it (why await_acks exists)."""

    async def body() -> None:
        acks = _acks(3)
        waiting = asyncio.create_task(asyncio.wait_for(asyncio.gather(*acks), timeout=30.0))
        await asyncio.sleep(0.01)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)

    assert await _reported(body) == ["_GatheringFuture exception was never retrieved"]

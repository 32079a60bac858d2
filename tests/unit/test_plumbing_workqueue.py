"""``plumbing.workqueue``: the rules on a clock the test moves, and the asyncio shell on a fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from plumbing.workqueue import AsyncDelayingQueue, DelayingQueue, Item

WINDOW = 0.25
"""A window, and instants below, that binary floating point holds exactly."""


def keys(items: Sequence[Item[str, Any]]) -> list[str]:
    return [item.key for item in items]


def test_a_key_added_while_idle_is_due_when_its_window_closes() -> None:
    q: DelayingQueue[str, str] = DelayingQueue(window=WINDOW)
    q.add("a", "JobSet ADDED", now=10.0)
    assert q.next_at() == 10.25
    assert q.take(now=10.125) == []
    assert q.take(now=10.25) == [Item(key="a", reasons=("JobSet ADDED",))]


def test_keys_added_while_a_window_is_open_join_it() -> None:
    q: DelayingQueue[str, str] = DelayingQueue(window=WINDOW)
    q.add("a", "JobSet ADDED", now=10.0)
    q.add("b", "ConfigMap ADDED", now=10.125)
    assert keys(q.take(now=10.25)) == ["a", "b"]
    q.done("a", now=10.25)
    q.done("b", now=10.25)
    q.add("c", "JobSet MODIFIED", now=10.5)  # the first window closed: a new one opens
    assert q.take(now=10.625) == []
    assert keys(q.take(now=10.75)) == ["c"]


def test_a_key_is_handed_out_once_with_its_reasons_in_order_and_once_each() -> None:
    q: DelayingQueue[str, str] = DelayingQueue(window=WINDOW)
    for reason in ("ConfigMap ADDED", "JobSet ADDED", "ConfigMap ADDED", "JobSet MODIFIED"):
        q.add("a", reason, now=10.0)
    assert q.take(now=11.0) == [Item(key="a", reasons=("ConfigMap ADDED", "JobSet ADDED", "JobSet MODIFIED"))]
    assert len(q) == 1 and "a" in q


def test_keys_added_while_the_consumer_works_wait_for_it_and_then_for_a_window() -> None:
    q: DelayingQueue[str, str] = DelayingQueue(window=WINDOW)
    q.add("a", "x", now=10.0)
    q.add("b", "x", now=10.0)
    assert keys(q.take(now=10.25)) == ["a", "b"]
    q.add("c", "x", now=10.5)  # another key, while the batch is out
    q.add("a", "y", now=10.5)  # a key that is out: it waits for its done
    assert q.next_at() is None
    q.done("a", now=11.0)
    assert q.next_at() is None  # b is still out
    q.done("b", now=12.0)
    assert q.next_at() == 12.25
    assert q.take(now=12.25) == [Item(key="c", reasons=("x",)), Item(key="a", reasons=("y",))]


def test_again_puts_a_key_back_with_its_reasons_first_and_says_since_when() -> None:
    q: DelayingQueue[str, str] = DelayingQueue(window=WINDOW)
    q.add("a", "ConfigMap ADDED", now=10.0)
    (item,) = q.take(now=10.25)
    assert item.requeued_since is None
    q.add("a", "JobSet ADDED", now=10.5)
    q.add("a", "ConfigMap ADDED", now=10.5)
    q.done("a", now=10.75, again=True)
    (item,) = q.take(now=11.0)
    assert item == Item(key="a", reasons=("ConfigMap ADDED", "JobSet ADDED"), requeued_since=10.75)
    q.done("a", now=11.25, again=True)
    (item,) = q.take(now=11.5)
    assert item.requeued_since == 10.75  # since the first "not yet", not the last
    q.done("a", now=11.5)
    assert len(q) == 0 and q.next_at() is None
    q.add("a", "JobSet MODIFIED", now=12.0)
    (item,) = q.take(now=12.25)
    assert item.requeued_since is None  # a new round starts afresh


def test_until_puts_a_key_back_for_an_instant_and_an_add_brings_it_to_its_window() -> None:
    q: DelayingQueue[str, str] = DelayingQueue(window=WINDOW)
    q.add("a", "JobSet MODIFIED", now=10.0)
    q.take(now=10.25)
    q.done("a", now=10.25, until=15.0)
    assert q.next_at() == 15.0 and q.take(now=14.75) == []
    assert q.take(now=15.0) == [Item(key="a", reasons=("JobSet MODIFIED",))]
    q.done("a", now=15.0, until=20.0)
    q.add("a", "JobSet MODIFIED", now=16.0)  # a new change: looked at in its window, not at 20
    assert q.take(now=16.25) == [Item(key="a", reasons=("JobSet MODIFIED",))]
    q.done("a", now=16.25)
    assert len(q) == 0 and q.next_at() is None and q.take(now=20.0) == []


def test_an_add_to_a_key_put_back_until_later_waits_for_the_busy_consumer_not_for_the_instant() -> None:
    q: DelayingQueue[str, str] = DelayingQueue(window=WINDOW)
    q.add("a", "x", now=10.0)
    q.add("b", "x", now=10.0)
    q.take(now=10.25)
    q.done("a", now=10.25, until=30.0)
    q.add("a", "y", now=11.0)  # b is still out: a waits for the consumer, then for a window
    assert q.next_at() is None
    q.done("b", now=12.0)
    assert q.take(now=12.25) == [Item(key="a", reasons=("x", "y"))]
    q.done("a", now=12.25)
    assert q.take(now=30.0) == []


def test_until_after_an_add_during_the_work_is_a_new_window() -> None:
    q: DelayingQueue[str, str] = DelayingQueue(window=WINDOW)
    q.add("a", "x", now=10.0)
    q.take(now=10.25)
    q.add("a", "y", now=10.5)  # a change while it was out: looked at again soon, whatever the consumer said
    q.done("a", now=10.5, until=30.0)
    assert q.take(now=10.75) == [Item(key="a", reasons=("x", "y"), requeued_since=10.5)]


def test_a_scheduled_key_is_due_at_its_instant_and_a_new_schedule_replaces_it() -> None:
    q: DelayingQueue[str, float] = DelayingQueue()
    assert q.schedule("a", 100.0, at=50.0)
    assert q.schedule("a", 200.0, at=60.0)  # the deadline moved: the earlier look is gone
    assert q.take(now=55.0) == []
    assert q.take(now=60.0) == [Item(key="a", reasons=(200.0,))]


def test_a_reason_already_handed_out_is_not_scheduled_again_until_forgotten() -> None:
    q: DelayingQueue[str, float] = DelayingQueue()
    q.schedule("a", 100.0, at=50.0)
    assert keys(q.take(now=50.0)) == ["a"]
    q.done("a", now=50.0)
    assert not q.schedule("a", 100.0, at=50.5)  # the report of this deadline asks for it again
    assert q.next_at() is None
    assert q.schedule("a", 300.0, at=70.0)  # a new deadline (the job was resumed) is another reason
    q.forget("a")
    assert q.next_at() is None
    assert q.schedule("a", 100.0, at=80.0)  # forgotten (the TrainJob was deleted): a new start


def test_cancel_drops_the_look_but_keeps_what_was_reported() -> None:
    q: DelayingQueue[str, float] = DelayingQueue()
    q.schedule("a", 100.0, at=50.0)
    q.take(now=50.0)
    q.done("a", now=50.0)
    q.schedule("b", 100.0, at=60.0)
    q.cancel("b")
    q.cancel("a")
    assert q.next_at() is None and q.take(now=1000.0) == []
    assert not q.schedule("a", 100.0, at=90.0)


def test_due_keys_come_in_the_order_they_fall_due() -> None:
    q: DelayingQueue[int, float] = DelayingQueue()
    for key, at in enumerate((5.0, 1.0, 3.0, 2.0, 4.0)):
        q.schedule(key, at, at=at)
    assert [item.key for item in q.take(now=3.5)] == [1, 3, 2]
    assert q.next_at() == 4.0


def test_rescheduling_many_times_keeps_the_heap_small() -> None:
    q: DelayingQueue[int, float] = DelayingQueue()
    for round_ in range(50):
        for key in range(100):
            q.schedule(key, float(round_), at=1000.0 - round_)
    assert len(q._heap) <= 2 * 100 + 64 + 1
    assert [item.reasons for item in q.take(now=951.0)] == [(49.0,)] * 100


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_the_shell_hands_out_due_keys_and_waits_for_the_next() -> None:
    clock = FakeClock()
    q: AsyncDelayingQueue[str, str] = AsyncDelayingQueue(window=0.0, clock=clock)
    q.add("a", "x")
    assert keys(await asyncio.wait_for(q.get(), 1)) == ["a"]
    q.done("a")
    waiting = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    assert not waiting.done()
    q.add("b", "y")  # due at once (no window): the waiting consumer wakes
    assert keys(await asyncio.wait_for(waiting, 1)) == ["b"]
    q.done("b")
    assert len(q) == 0


async def test_the_shell_wakes_for_a_scheduled_key_on_the_loop_timer() -> None:
    clock = FakeClock()
    q: AsyncDelayingQueue[str, float] = AsyncDelayingQueue(clock=clock)
    assert q.schedule("a", 1.0, delay=0.0)
    assert q.schedule("b", 2.0, delay=3600.0)  # not due: the consumer must not be handed it
    assert keys(await asyncio.wait_for(q.get(), 1)) == ["a"]
    q.done("a")
    waiting = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    assert not waiting.done()
    clock.now += 3600.0
    q.cancel("b")
    assert q.schedule("b", 3.0, delay=0.0)
    assert [item.reasons for item in await asyncio.wait_for(waiting, 1)] == [(3.0,)]
    q.forget("b")

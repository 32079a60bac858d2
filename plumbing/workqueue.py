"""A keyed, de-duplicating, delaying work queue, after client-go's ``util/workqueue``, for one asyncio consumer.

Controllers built on client-go put keys, not objects, into one queue: a key added twice before it is taken
is taken once (de-duplication), a key re-added while it is being worked on waits until that work is done
and is then taken again (never worked on twice at once), and a key can be added for later (``AddAfter``).
The object is read from the informer's cache when the key is taken, so the work always sees the latest of
every change that was folded into it. The watcher needs the same three things, and one more: the changes
that make a key ready are gathered for a short *window*, so that a TrainJob's snapshot ConfigMap and
JobSet, written within milliseconds of each other, make one observation rather than two.

``DelayingQueue`` is the whole of the rules, and it reads no clock and starts no task: every call that
depends on time is given ``now``, so tests drive it through any sequence of instants without sleeping.
``AsyncDelayingQueue`` is the thin shell that gives it ``time.monotonic`` and wakes the consumer when
the next key is due.

The rules:

* ``add(key, reason)`` gathers: the key is ready when the open window closes, or, if no window is open,
  when one opened now closes. A window opens only while the consumer is free: keys added while it works
  on a batch wait for it, and their window opens when it has marked every key of the batch done. Each
  key keeps the reasons it was added for, in order and once each.
* ``done(key, again=True)`` is "not yet": the key goes back into the next window with the reasons it was
  handed out with, ahead of any added since, and the item says since when it has been going round
  (``requeued_since``), so the consumer can bound how long it holds a key back. ``done(key, until=at)``
  is "not before ``at``": the key waits until then, with its reasons, unless it is added again meanwhile,
  which brings it to that add's window as any add would.
* ``schedule(key, reason, at)`` looks at the key again at that instant, replacing the key's earlier
  scheduled look, and does so once per reason: a reason already handed out for the key is not scheduled
  again until the key is ``forget``-ed. (A TrainJob's deadline is reported once; publishing that report
  asks for the same deadline to be scheduled again, which must not loop.) A queue is used either for
  gathering or for scheduled looks; ``schedule`` replaces whatever waits for the key.

Due keys sit in a heap by time, so a queue holding ten thousand scheduled keys costs a logarithm, not a
scan, per change.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
R = TypeVar("R", bound=Hashable)


@dataclass(frozen=True)
class Item(Generic[K, R]):
    """A key handed out to the consumer, with the reasons gathered for it."""

    key: K
    reasons: tuple[R, ...]
    requeued_since: float | None = None
    """When the consumer first said "not yet" for this key (``done(again=True)``), if it has."""


@dataclass
class _Entry(Generic[R]):
    reasons: list[R] = field(default_factory=list)
    ready_at: float | None = None
    """When the key is due; ``None`` while it waits for a window to open."""
    stamp: int = 0
    """Matches the heap record that is current for this entry; older records are skipped."""
    scheduled: bool = False
    requeued_since: float | None = None
    deferred: bool = False
    """Handed back with ``until``: an add brings it to the add's window instead."""

    def merge(self, reasons: list[R]) -> None:
        self.reasons.extend(reason for reason in reasons if reason not in self.reasons)


class DelayingQueue(Generic[K, R]):
    """The queue's rules, pure: every time comes in as ``now`` or ``at`` (seconds on one monotonic clock)."""

    def __init__(self, *, window: float = 0.0) -> None:
        self.window = window
        self._waiting: dict[K, _Entry[R]] = {}
        """Keys not handed out: due at ``ready_at``, or waiting for the next window (``ready_at is None``)."""
        self._processing: dict[K, _Entry[R]] = {}
        """Keys handed out and not yet done, with what they were handed out with."""
        self._after_done: dict[K, _Entry[R]] = {}
        """Keys added while they were being worked on: they wait for ``done``."""
        self._fired: dict[K, R] = {}
        """The reason each scheduled key was last handed out for."""
        self._heap: list[tuple[float, int, K]] = []
        self._stamps = itertools.count(1)
        self._window_closes: float | None = None

    def __len__(self) -> int:
        """Keys waiting or in the consumer's hands."""
        return len(self._waiting.keys() | self._processing.keys())

    def __contains__(self, key: object) -> bool:
        return key in self._waiting or key in self._processing

    # ----------------------------------------------------------------------------------- adding

    def add(self, key: K, reason: R, *, now: float) -> None:
        """Gather ``key`` into the open window (or one opened now), for ``reason``."""
        self._gather(key, [reason], now=now)

    def schedule(self, key: K, reason: R, *, at: float) -> bool:
        """Hand ``key`` out at ``at`` for ``reason``, once per reason; whether it was scheduled."""
        self.cancel(key)
        if self._fired.get(key) == reason:
            return False
        entry = _Entry(reasons=[reason], scheduled=True)
        self._waiting[key] = entry
        self._set_ready(key, entry, at)
        return True

    def cancel(self, key: K) -> None:
        """Drop what waits for ``key`` (not what is in the consumer's hands, nor the reasons already fired)."""
        self._waiting.pop(key, None)
        self._after_done.pop(key, None)

    def forget(self, key: K) -> None:
        """Drop everything known of ``key``: what waits for it and the reasons it was handed out for."""
        self.cancel(key)
        self._fired.pop(key, None)

    def _gather(self, key: K, reasons: list[R], *, now: float, requeued_since: float | None = None) -> None:
        if key in self._processing:
            self._after_done.setdefault(key, _Entry()).merge(reasons)
            return
        entry = self._waiting.get(key)
        if entry is None:
            entry = self._waiting[key] = _Entry(requeued_since=requeued_since)
        elif entry.deferred:
            entry.deferred, entry.ready_at, entry.stamp = False, None, next(self._stamps)  # its old due time goes
        entry.merge(reasons)
        if self._processing:
            return  # the consumer is busy: this key's window opens when it is done
        closes = self._window_closes
        if closes is None or closes <= now:
            closes = self._window_closes = now + self.window
        if entry.ready_at is None or closes < entry.ready_at:
            self._set_ready(key, entry, closes)

    def _set_ready(self, key: K, entry: _Entry[R], at: float) -> None:
        entry.ready_at = at
        entry.stamp = next(self._stamps)
        heapq.heappush(self._heap, (at, entry.stamp, key))
        if len(self._heap) > 2 * len(self._waiting) + 64:
            self._heap = [(e.ready_at, e.stamp, k) for k, e in self._waiting.items() if e.ready_at is not None]
            heapq.heapify(self._heap)

    # --------------------------------------------------------------------------------- taking

    def _current_top(self) -> tuple[float, int, K] | None:
        while self._heap:
            _, stamp, key = self._heap[0]
            entry = self._waiting.get(key)
            if entry is not None and entry.stamp == stamp:
                return self._heap[0]
            heapq.heappop(self._heap)
        return None

    def next_at(self) -> float | None:
        """When the next key is due, if one is."""
        top = self._current_top()
        return None if top is None else top[0]

    def take(self, *, now: float) -> list[Item[K, R]]:
        """Every key due by ``now``, in the order they fell due; the consumer must mark each ``done``."""
        taken: list[Item[K, R]] = []
        while (top := self._current_top()) is not None and top[0] <= now:
            heapq.heappop(self._heap)
            key = top[2]
            entry = self._waiting.pop(key)
            self._processing[key] = entry
            if entry.scheduled:
                self._fired[key] = entry.reasons[-1]
            taken.append(Item(key=key, reasons=tuple(entry.reasons), requeued_since=entry.requeued_since))
        return taken

    def done(self, key: K, *, now: float, again: bool = False, until: float | None = None) -> None:
        """The consumer is through with ``key``; with ``again``, it goes round once more, and with ``until``,
        once more at that instant unless added again before (see the module)."""
        entry = self._processing.pop(key, None)
        later = self._after_done.pop(key, None)
        if entry is not None and until is not None and later is None:
            waiting = self._waiting[key] = _Entry(
                reasons=list(entry.reasons), requeued_since=entry.requeued_since, deferred=True
            )
            self._set_ready(key, waiting, until)
        elif entry is not None and (again or until is not None):
            since = entry.requeued_since if entry.requeued_since is not None else now
            self._gather(key, entry.reasons + (later.reasons if later else []), now=now, requeued_since=since)
        elif later is not None:
            self._gather(key, later.reasons, now=now)
        if not self._processing:
            self._open_pending_window(now)

    def _open_pending_window(self, now: float) -> None:
        pending = [(key, entry) for key, entry in self._waiting.items() if entry.ready_at is None]
        if not pending:
            return
        closes = self._window_closes = now + self.window
        for key, entry in pending:
            self._set_ready(key, entry, closes)


class AsyncDelayingQueue(Generic[K, R]):
    """``DelayingQueue`` on the event loop's clock: ``get`` waits until keys are due and hands them out."""

    def __init__(self, *, window: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.rules: DelayingQueue[K, R] = DelayingQueue(window=window)
        self._clock = clock
        self._due = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    def __len__(self) -> int:
        return len(self.rules)

    def add(self, key: K, reason: R) -> None:
        self.rules.add(key, reason, now=self._clock())
        self._changed()

    def schedule(self, key: K, reason: R, *, delay: float) -> bool:
        scheduled = self.rules.schedule(key, reason, at=self._clock() + delay)
        self._changed()
        return scheduled

    def cancel(self, key: K) -> None:
        self.rules.cancel(key)

    def forget(self, key: K) -> None:
        self.rules.forget(key)

    def done(self, key: K, *, again: bool = False, delay: float | None = None) -> None:
        now = self._clock()
        self.rules.done(key, now=now, again=again, until=None if delay is None else now + delay)
        self._changed()

    async def get(self) -> list[Item[K, R]]:
        """The keys due now, as soon as there are any."""
        while True:
            taken = self.rules.take(now=self._clock())
            if taken:
                return taken
            self._due.clear()
            self._changed()
            await self._due.wait()

    def _changed(self) -> None:
        """Wake the consumer when the earliest due key falls due (a timer only if that is sooner than set)."""
        at = self.rules.next_at()
        if at is None:
            return
        delay = at - self._clock()
        if delay <= 0:
            self._due.set()
            return
        if self._timer is not None and self._timer_at <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._due.set()

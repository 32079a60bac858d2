"""The retry policies of the whole pipeline, named once, built on tenacity.

Every stage retries the same few things: a Kubernetes request that failed for now, an API server that does not
answer yet, a watch that broke and must list again, a bus request or set-up step, and a publish a full stream
refused. Each gets one policy here, so a reader sees which differences between two loops are meant (a different
thing waited for) and which are not. Every wait grows exponentially to a cap and is spread by jitter (each wait
drawn between half and one and a half of its exponential value), so replicas that failed together do not retry
together.

A policy is a value: ``retrying()`` gives a tenacity ``AsyncRetrying`` for a loop that tenacity drives
whole, and ``delay(attempt)`` the wait tenacity would take before that attempt's retry, for a loop whose
state outlives one call (an informer's failure count resets when its watch delivers; a nak's delay comes from
the message's delivery count). Both read the same tenacity pieces. ``call(attempt)`` is ``retrying()`` for the
hot paths (every publish, every apply): the loop starts only once a first try has failed.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_never,
    wait_exponential,
)
from tenacity.retry import retry_base
from tenacity.stop import stop_base

T = TypeVar("T")


class wait_jittered_exponential(wait_exponential):  # named as tenacity names its waits
    """tenacity's exponential wait (doubling from ``initial`` up to ``maximum``), spread over half to one and a
    half of it."""

    def __init__(self, initial: float, maximum: float) -> None:
        super().__init__(multiplier=initial, max=maximum)
        self.initial = initial
        self.maximum = maximum

    def __call__(self, retry_state: RetryCallState) -> float:
        return float(super().__call__(retry_state)) * random.uniform(0.5, 1.5)


@dataclass(frozen=True)
class Policy:
    """What is retried, how long to wait before each retry, and when to stop."""

    name: str
    initial: float
    """The first wait, in seconds, before jitter."""
    maximum: float
    """The cap of a wait, in seconds, before jitter."""
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    """The failures retried; any other is raised at once."""
    retry_if: Callable[[BaseException], bool] | None = field(default=None, compare=False)
    """Instead of ``retry_on``: the failures retried, told by a test of the error itself."""
    attempts: int | None = None
    """Attempts in all, the first included; ``None``: until it succeeds (or the task is cancelled)."""
    wait_at_least: Callable[[BaseException], float | None] | None = field(default=None, compare=False)
    """A wait the failure itself asks for (a Retry-After), taken when longer than the policy's."""

    def with_limits(self, *, attempts: int | None = None, maximum: float | None = None) -> Policy:
        """The same policy with a setting's attempt count or cap."""
        return replace(
            self,
            attempts=attempts if attempts is not None else self.attempts,
            maximum=maximum if maximum is not None else self.maximum,
        )

    @property
    def wait(self) -> Callable[[RetryCallState], float]:
        base = wait_jittered_exponential(self.initial, self.maximum)
        at_least = self.wait_at_least
        if at_least is None:
            return base

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome is not None else None
            asked = at_least(exc) if exc is not None else None
            return max(base(state), asked or 0.0)

        return wait

    @property
    def stop(self) -> stop_base:
        return stop_never if self.attempts is None else stop_after_attempt(self.attempts)

    @property
    def retry(self) -> retry_base:
        return retry_if_exception(self.retries)

    def retries(self, error: BaseException) -> bool:
        """Whether this policy retries ``error``."""
        return self.retry_if(error) if self.retry_if is not None else isinstance(error, self.retry_on)

    def retrying(
        self, on_retry: Callable[[BaseException, float], object] | None = None, **kwargs: Any
    ) -> AsyncRetrying:
        """A tenacity loop with this policy; the last failure is raised as itself when it stops.

        ``on_retry(error, wait)`` is told of each failure that will be retried, before the wait (to log it)."""
        if on_retry is not None:
            tell = on_retry

            def before_sleep(state: RetryCallState) -> None:
                error = state.outcome.exception() if state.outcome is not None else None
                if error is not None:
                    tell(error, state.upcoming_sleep)

            kwargs["before_sleep"] = before_sleep
        return AsyncRetrying(retry=self.retry, stop=self.stop, wait=self.wait, reraise=True, **kwargs)

    async def call(
        self, attempt: Callable[[], Awaitable[T]], on_retry: Callable[[BaseException, float], object] | None = None
    ) -> T:
        """``attempt()`` under this policy, as a loop of ``retrying()`` runs it, but with the first try outside it.

        Almost every call succeeds at once, and building and stepping tenacity's loop costs some tens of
        microseconds a call: on every publish and every apply, about 0.3 ms of CPU per TrainJob (found by
        bisecting the benchmark). So the loop starts only after a first failure this policy retries, and then
        waits and stops as if it had run from the start: the first wait is the policy's first, the loop's waits
        go on from the second step of the curve, and it has one attempt fewer to make. ``on_retry`` is told of
        every failure retried, the first one included.
        """
        try:
            return await attempt()
        except Exception as error:
            if self.attempts == 1 or not self.retries(error):
                raise
            wait = self.wait(self._state(1, error))
            if on_retry is not None:
                on_retry(error, wait)
        await asyncio.sleep(wait)
        rest = replace(self, initial=self.initial * 2, attempts=None if self.attempts is None else self.attempts - 1)
        async for retried in rest.retrying(on_retry):
            with retried:
                return await attempt()
        raise AssertionError("unreachable: a policy raises the last failure when it stops")

    def delay(self, attempt: int) -> float:
        """The wait after failed attempt number ``attempt`` (1 is the first), as ``retrying()`` would take it."""
        return wait_jittered_exponential(self.initial, self.maximum)(self._state(attempt))

    def _state(self, attempt: int, error: BaseException | None = None) -> RetryCallState:
        """tenacity's state after failed attempt number ``attempt``, ``error`` its failure if known."""
        state = RetryCallState(self.retrying(), fn=None, args=(), kwargs={})
        state.attempt_number = max(1, attempt)
        if error is not None:
            state.set_exception((type(error), error, error.__traceback__))
        return state


TRANSIENT_API_ERROR = Policy("transient API error", initial=0.1, maximum=8.0, attempts=5)
"""A Kubernetes write that failed for now (a conflict, a 429 or 5xx, a timeout), retried in the process a few
times before the message goes back to the stream; the applier sets what is retried, the attempts, the cap, and
the Retry-After it honours."""

API_UNAVAILABLE = Policy("API server unavailable", initial=0.5, maximum=10.0, retry_on=(OSError, TimeoutError))
"""A read a service needs before it can start its work (the cluster's identity, whether it may watch), while
the API server does not answer; asked again until it does. The caller adds its API error type."""

WATCH_RELIST = Policy("watch re-list", initial=1.0, maximum=30.0)
"""A watch that failed: resume or list again after a wait, longer with every failure in a row, reset once the
watch delivers again; up to half a minute, as an API server that is down for long is not helped by asking
more often."""

BUS_REQUEST = Policy("bus request", initial=0.2, maximum=5.0)
"""A request to the bus that got no answer (a timeout, no responders, a stream without a leader yet): publish
again or set up again, until it works."""

BUS_SET_UP = Policy("bus set-up", initial=0.5, maximum=5.0)
"""A bus set-up or binding step while a JetStream cluster elects leaders or the admin set-up has not run yet."""

FULL_STREAM = Policy("full stream", initial=0.2, maximum=10.0)
"""A publish a work stream refused because it is full (it stored nothing): the publisher keeps the message and
waits for the consumers to make room, longer each time (``plumbing.publishing``)."""

FULL_STREAM_REDELIVERY = Policy("full stream, redelivered", initial=2.0, maximum=30.0)
"""The same wait when the message to keep is one the stage took from a stream: it is nak'd with this delay,
from its delivery count, and comes back to be done again."""

TRANSIENT_REDELIVERY = Policy("transient error, redelivered", initial=2.0, maximum=60.0)
"""A message whose in-process attempts all failed for now goes back to its stream, nak'd with this delay from
its delivery count: longer than a full stream's, as the API server (not the bus) is what must recover."""

LOG_CAPTURE = Policy("log capture", initial=2.0, maximum=30.0, attempts=3)
"""Keeping a finished TrainJob's pod logs when the bus or the API server did not answer: a few tries, then it is
left (its page then shows no capture; a failed read of one log is recorded, not retried)."""

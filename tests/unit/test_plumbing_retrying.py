"""``plumbing.retrying``: each policy's waits grow to their cap within its jitter, and it retries only what
it names, as often as it says."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from tenacity import RetryCallState, wait_exponential

from plumbing import retrying
from plumbing.retrying import Policy

POLICIES = [
    retrying.TRANSIENT_API_ERROR,
    retrying.API_UNAVAILABLE,
    retrying.WATCH_RELIST,
    retrying.BUS_REQUEST,
    retrying.BUS_SET_UP,
    retrying.FULL_STREAM,
    retrying.FULL_STREAM_REDELIVERY,
    retrying.TRANSIENT_REDELIVERY,
]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_waits_double_to_the_cap_within_the_jitter(policy: Policy) -> None:
    unjittered = wait_exponential(multiplier=policy.initial, max=policy.maximum)  # tenacity's own, as the oracle
    for attempt in range(1, 12):
        state = RetryCallState(None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.attempt_number = attempt
        expected = unjittered(state)
        for _ in range(50):
            assert 0.5 * expected <= policy.delay(attempt) <= 1.5 * expected


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_waits_are_spread(policy: Policy) -> None:
    """Replicas that failed together do not all come back at the same moment."""
    assert len({round(policy.delay(3), 6) for _ in range(20)}) > 1


def test_the_first_attempt_waits_the_initial_wait() -> None:
    policy = retrying.FULL_STREAM
    assert all(0.1 <= policy.delay(1) <= 0.3 for _ in range(50))
    assert all(0.1 <= policy.delay(0) <= 0.3 for _ in range(50))  # a count not yet kept is the first


def test_limits_are_taken_from_settings() -> None:
    policy = retrying.TRANSIENT_API_ERROR.with_limits(attempts=3, maximum=0.5)
    assert (policy.attempts, policy.maximum, policy.initial) == (3, 0.5, retrying.TRANSIENT_API_ERROR.initial)
    assert all(policy.delay(10) <= 0.75 for _ in range(50))
    assert retrying.TRANSIENT_API_ERROR.with_limits().attempts == retrying.TRANSIENT_API_ERROR.attempts


def _fast(policy: Policy, **changes: object) -> Policy:
    return dataclasses.replace(policy, initial=0.001, maximum=0.001, **changes)  # type: ignore[arg-type]


def _run(policy: Policy, failures: list[BaseException]) -> tuple[int, list[tuple[str, float]]]:
    """Calls made, and what ``on_retry`` was told, for a step failing with ``failures`` and then succeeding."""
    calls = 0
    told: list[tuple[str, float]] = []

    async def main() -> None:
        nonlocal calls
        async for attempt in policy.retrying(on_retry=lambda exc, wait: told.append((type(exc).__name__, wait))):
            with attempt:
                calls += 1
                if failures:
                    raise failures.pop(0)

    asyncio.run(main())
    return calls, told


def test_retries_what_it_names_until_it_succeeds() -> None:
    policy = _fast(retrying.API_UNAVAILABLE)
    calls, told = _run(policy, [OSError("refused"), TimeoutError(), OSError("reset")])
    assert calls == 4
    assert [name for name, _ in told] == ["OSError", "TimeoutError", "OSError"]
    assert all(0 < wait <= 0.0015 for _, wait in told)


def test_other_failures_are_raised_at_once() -> None:
    with pytest.raises(ValueError, match="bad input"):
        _run(_fast(retrying.API_UNAVAILABLE), [ValueError("bad input")])


def test_a_bounded_policy_raises_the_last_failure_itself() -> None:
    policy = _fast(retrying.BUS_SET_UP, attempts=3, retry_on=(TimeoutError,))
    failures: list[BaseException] = [TimeoutError("1"), TimeoutError("2"), TimeoutError("3"), TimeoutError("4")]
    with pytest.raises(TimeoutError, match="3"):
        _run(policy, failures)
    assert len(failures) == 1  # three attempts, no fourth


def test_retry_if_tests_the_error_itself() -> None:
    policy = _fast(retrying.FULL_STREAM, retry_if=lambda exc: "full" in str(exc))
    calls, _ = _run(policy, [RuntimeError("stream full"), RuntimeError("stream full")])
    assert calls == 3
    with pytest.raises(RuntimeError, match="other"):
        _run(policy, [RuntimeError("other")])


def test_a_wait_the_failure_asks_for_is_taken_when_longer() -> None:
    class Slow(Exception):
        retry_after = 0.05

    policy = _fast(
        retrying.TRANSIENT_API_ERROR, retry_on=(Slow,), wait_at_least=lambda exc: getattr(exc, "retry_after", None)
    )
    _, told = _run(policy, [Slow(), Slow()])
    assert [wait for _, wait in told] == [0.05, 0.05]


def test_call_returns_a_first_success_without_a_retry() -> None:
    told: list[tuple[BaseException, float]] = []

    async def attempt() -> str:
        return "done"

    assert asyncio.run(_fast(retrying.BUS_REQUEST).call(attempt, on_retry=lambda e, w: told.append((e, w)))) == "done"
    assert told == []


@pytest.mark.parametrize("failures", [4, 5])
def test_call_retries_as_the_loop_would_and_tells_of_every_retried_failure(failures: int) -> None:
    """Five attempts in all: four failures are retried (each told, with waits along the policy's curve) and the
    fifth try succeeds; with a fifth failure, that failure is raised as itself."""
    policy = dataclasses.replace(
        retrying.TRANSIENT_API_ERROR, initial=0.001, maximum=0.004, attempts=5, retry_on=(ValueError,)
    )
    calls = 0
    told: list[float] = []

    async def attempt() -> str:
        nonlocal calls
        calls += 1
        if calls <= failures:
            raise ValueError(f"failure {calls}")
        return "done"

    if failures == 5:
        with pytest.raises(ValueError, match="failure 5"):
            asyncio.run(policy.call(attempt, on_retry=lambda e, w: told.append(w)))
    else:
        assert asyncio.run(policy.call(attempt, on_retry=lambda e, w: told.append(w))) == "done"
    assert calls == 5
    assert len(told) == 4
    # 1, 2, 4, 4 ms before jitter (the cap is 4): the loop goes on from the curve's second step.
    for wait, expected in zip(told, (0.001, 0.002, 0.004, 0.004), strict=True):
        assert 0.5 * expected <= wait <= 1.5 * expected


def test_call_raises_what_the_policy_does_not_retry_and_honours_a_longer_asked_wait() -> None:
    policy = _fast(retrying.TRANSIENT_API_ERROR, retry_on=(ValueError,), wait_at_least=lambda e: 0.02)
    calls = 0

    async def refused() -> None:
        nonlocal calls
        calls += 1
        raise KeyError("not retried")

    with pytest.raises(KeyError):
        asyncio.run(policy.call(refused))
    assert calls == 1

    told: list[float] = []

    async def once_then_fine() -> int:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise ValueError("for now")
        return calls

    assert asyncio.run(policy.call(once_then_fine, on_retry=lambda e, w: told.append(w))) == 3
    assert told == [0.02]  # the asked wait, longer than the policy's first


def test_call_with_one_attempt_tries_once() -> None:
    policy = _fast(retrying.TRANSIENT_API_ERROR, attempts=1, retry_on=(ValueError,))
    calls = 0

    async def failing() -> None:
        nonlocal calls
        calls += 1
        raise ValueError("once")

    with pytest.raises(ValueError):
        asyncio.run(policy.call(failing))
    assert calls == 1

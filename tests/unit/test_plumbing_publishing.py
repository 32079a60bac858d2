"""``plumbing.publishing.publish``: the one publish path of every stage, with its differences as arguments
(signed or not, waiting out a full stream or any bus failure or nothing, pipelined or one at a time).

The bus is a stand-in that records what it is asked and fails as told; the same path against a real server
with a full stream is checked in tests/progress_under_load/test_stalls.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import nats.errors
import nats.js.errors
import pytest
from nats.js import api as js_api

from plumbing import publishing, retrying, signing
from plumbing.publishing import Outgoing, publish

FAST = dataclasses.replace(publishing.WAIT_FOR_ROOM, initial=0.001, maximum=0.001)


def _full() -> nats.js.errors.APIError:
    return nats.js.errors.APIError(code=503, err_code=publishing.STREAM_FULL_CODE, description="maximum bytes exceeded")


class Bus:
    """Answers each publish with a PubAck, after failing the first ones with ``failures``."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.calls: list[tuple[str, bytes, dict[str, str] | None]] = []
        self.pipelined: list[str] = []

    def _ack(self) -> js_api.PubAck:
        return js_api.PubAck(stream="S", seq=len(self.calls))

    async def publish(
        self, subject: str, payload: bytes, *, headers: dict[str, str] | None = None, timeout: float = 0
    ) -> js_api.PubAck:
        self.calls.append((subject, payload, headers))
        if self.failures:
            raise self.failures.pop(0)
        return self._ack()

    async def publish_async(
        self, subject: str, payload: bytes, *, headers: dict[str, str] | None = None
    ) -> asyncio.Future[Any]:
        self.calls.append((subject, payload, headers))
        self.pipelined.append(subject)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.failures:
            failure = self.failures.pop(0)
            if not isinstance(failure, TimeoutError):  # a TimeoutError stands for a PubAck that never comes
                future.set_exception(failure)
        else:
            future.set_result(self._ack())
        return future


def _run(bus: Bus, messages: list[Outgoing], **kwargs: Any) -> list[js_api.PubAck]:
    return asyncio.run(publish(bus, messages, stream="S", **kwargs))  # type: ignore[arg-type]


def test_signed_for_its_subject() -> None:
    signer = signing.Signer(signing.generate_private_key())
    bus = Bus()
    _run(bus, [Outgoing("a.b", b"x", {"Nats-Msg-Id": "1"})], signer=signer)
    ((subject, payload, headers),) = bus.calls
    assert headers is not None and headers["Nats-Msg-Id"] == "1"
    verified = signing.Keyring.of(signer.public_key).verify(subject, payload, headers)
    assert verified is not None


def test_a_full_stream_is_waited_out_and_counted() -> None:
    bus = Bus(_full(), _full())
    told: list[float] = []
    (ack,) = _run(bus, [Outgoing("a.b", b"x")], retry=FAST, on_retry=lambda _, wait: told.append(wait))
    assert len(bus.calls) == 3 and len(told) == 2 and ack.seq == 3


def test_by_default_other_failures_are_the_callers() -> None:
    bus = Bus(nats.errors.NoRespondersError())
    with pytest.raises(nats.errors.NoRespondersError):
        _run(bus, [Outgoing("a.b", b"x")])
    assert len(bus.calls) == 1


def test_a_policy_for_any_bus_failure() -> None:
    keep = dataclasses.replace(retrying.BUS_REQUEST, initial=0.001, maximum=0.001)
    bus = Bus(nats.errors.NoRespondersError(), TimeoutError(), _full())
    (ack,) = _run(bus, [Outgoing("a.b", b"x")], retry=keep)
    assert len(bus.calls) == 4 and ack.seq == 4


def test_no_policy_tries_once() -> None:
    bus = Bus(_full())
    with pytest.raises(nats.js.errors.APIError):
        _run(bus, [Outgoing("a.b", b"x"), Outgoing("a.c", b"y")], retry=None)
    assert len(bus.calls) == 1


def test_one_at_a_time_in_order() -> None:
    bus = Bus()
    acks = _run(bus, [Outgoing("a.1", b"x"), Outgoing("a.2", b"y")])
    assert [subject for subject, _, _ in bus.calls] == ["a.1", "a.2"] and not bus.pipelined
    assert [ack.seq for ack in acks] == [1, 2]


def test_pipelined_sends_all_then_returns_every_ack() -> None:
    bus = Bus()
    acks = _run(bus, [Outgoing("a.1", b"x"), Outgoing("a.2", b"y")], pipelined=True, timeout=5.0)
    assert bus.pipelined == ["a.1", "a.2"] and [ack.seq for ack in acks] == [1, 2]


def test_pipelined_refusal_is_raised_not_retried() -> None:
    bus = Bus(_full())
    with pytest.raises(nats.js.errors.APIError):
        _run(bus, [Outgoing("a.1", b"x"), Outgoing("a.2", b"y")], pipelined=True, timeout=5.0, retry=FAST)
    assert len(bus.calls) == 2


def test_pipelined_lost_ack_asks_again_once_then_raises_the_timeout() -> None:
    """A lost PubAck may be a refusal nats-py lost: the first message is published again synchronously (a
    refusal would raise there); a stored one answers, and the timeout still hands the work back."""
    bus = Bus(TimeoutError())
    with pytest.raises(TimeoutError):
        _run(bus, [Outgoing("a.1", b"x"), Outgoing("a.2", b"y")], pipelined=True, timeout=0.05)
    assert [subject for subject, _, _ in bus.calls] == ["a.1", "a.2", "a.1"]

"""When the standing pull request is asked for again: after a reconnect at once, after a silence of three
heartbeats, and otherwise not while half of its window is still outstanding."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from plumbing.pull import HEARTBEAT_SECONDS, StreamingPull


class FakeClient:
    """What ``StreamingPull`` uses of a nats.py client: its reconnect count, its state and publish."""

    def __init__(self) -> None:
        self.stats = {"reconnects": 0}
        self.is_connected = True
        self.requests: list[dict[str, Any]] = []

    def new_inbox(self) -> str:
        return "_INBOX.test"

    async def publish(self, subject: str, payload: bytes, reply: str = "") -> None:
        self.requests.append(json.loads(payload))


def _pull(client: FakeClient, **kwargs: Any) -> StreamingPull:
    return StreamingPull(client, stream="S", durable="d", batch=8, **kwargs)  # type: ignore[arg-type]


async def test_a_standing_window_is_not_asked_for_again() -> None:
    client = FakeClient()
    pull = _pull(client)
    await pull._top_up()
    await pull._top_up()
    assert [r["batch"] for r in client.requests] == [8]
    assert client.requests[0]["idle_heartbeat"] == int(HEARTBEAT_SECONDS * 1e9)


async def test_a_reconnect_asks_for_the_whole_window_at_once() -> None:
    client = FakeClient()
    pull = _pull(client)
    await pull._top_up()
    client.stats["reconnects"] += 1  # the server forgot the request with the old connection
    await pull._top_up()
    assert [r["batch"] for r in client.requests] == [8, 8]


async def test_three_silent_heartbeats_ask_again() -> None:
    client = FakeClient()
    pull = _pull(client)
    await pull._top_up()
    pull._last_heard = time.monotonic() - 3 * pull.heartbeat - 0.1
    await pull._top_up()
    assert [r["batch"] for r in client.requests] == [8, 8]


def test_the_heartbeat_stays_well_inside_a_short_expiry() -> None:
    assert _pull(FakeClient(), expires=5.0).heartbeat <= 5.0 / 3
    assert _pull(FakeClient()).heartbeat == HEARTBEAT_SECONDS


class FakeMsg:
    def __init__(self, headers: dict[str, str] | None = None, data: bytes = b"") -> None:
        self.headers = headers
        self.data = data


async def test_a_request_that_ends_is_asked_for_again_at_once_not_at_the_next_heartbeat() -> None:
    client = FakeClient()
    pull = _pull(client)
    waiting = asyncio.create_task(pull.next_batch(timeout=3.0))
    await asyncio.sleep(0.05)
    assert len(client.requests) == 1
    await pull._arrived(FakeMsg({"Status": "408", "Nats-Pending-Messages": "8"}))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert len(client.requests) == 2, "the waiting loop sat out the request's end until its next heartbeat"
    await pull._arrived(FakeMsg(data=b"work"))  # type: ignore[arg-type]
    assert [m.data for m in await waiting] == [b"work"]

"""``plumbing.bus_history.read_stream`` on a real nats-server: batched direct gets, no consumer, every way of
starting."""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import pytest

from plumbing import bus, bus_history

pytestmark = pytest.mark.nats


async def test_read_stream_pages_filters_and_starts_where_asked(nats_connect: Any) -> None:
    nc = await nats_connect()  # admin: a stream of its own
    js = nc.jetstream()
    name = f"RS_{secrets.token_hex(3).upper()}"
    prefix = name.lower()
    await js.add_stream(name=name, subjects=[f"{prefix}.>"], allow_direct=True)
    try:
        for i in range(25):
            await js.publish(f"{prefix}.{i % 3}.x", f"m{i}".encode(), headers={"X-N": str(i), bus.MSG_ID: f"id-{i}"})
        await asyncio.sleep(1.1)
        middle = time.time()
        await asyncio.sleep(0.1)
        for i in range(25, 30):
            await js.publish(f"{prefix}.{i % 3}.x", f"m{i}".encode())

        everything = await bus_history.read_stream(js, name, f"{prefix}.>", batch=4)  # several pages
        assert [m.data for m in everything] == [f"m{i}".encode() for i in range(30)]
        assert [m.seq for m in everything] == list(range(1, 31))
        assert everything[0].headers == {"X-N": "0", bus.MSG_ID: "id-0"}  # the stream's own headers stripped
        assert everything[0].subject == f"{prefix}.0.x" and everything[0].stream == name
        assert abs(everything[0].time - time.time()) < 60

        ones = await bus_history.read_stream(js, name, f"{prefix}.1.>")
        assert [m.data for m in ones] == [f"m{i}".encode() for i in range(1, 30, 3)]
        assert [m.seq for m in await bus_history.read_stream(js, name, f"{prefix}.>", start_seq=28)] == [28, 29, 30]
        since = await bus_history.read_stream(js, name, f"{prefix}.>", start_time=middle)
        assert [m.data for m in since] == [f"m{i}".encode() for i in range(25, 30)]
        newest = await bus_history.read_stream(js, name, f"{prefix}.>", last_per_subject=True)
        assert [m.data for m in newest] == [b"m27", b"m28", b"m29"]
        assert await bus_history.read_stream(js, name, f"{prefix}.nothing.>") == []
        # A reader that pages on its own: at least `limit` messages, whole batches, from where it asks.
        first = await bus_history.read_stream(js, name, f"{prefix}.>", batch=4, limit=6)
        assert [m.seq for m in first] == list(range(1, 9))
        rest = await bus_history.read_stream(js, name, f"{prefix}.>", start_seq=first[-1].seq + 1, batch=4, limit=100)
        assert [m.seq for m in rest] == list(range(9, 31))
        assert (await js.stream_info(name)).state.consumer_count == 0  # read without a consumer
    finally:
        await js.delete_stream(name)
        await nc.close()

"""Partition leases on a real nats-server: fair shares, rebalancing, and takeover after a replica dies."""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import pytest

from plumbing.partitions import PartitionLeases

pytestmark = pytest.mark.nats


class Recorder:
    def __init__(self) -> None:
        self.owned: set[int] = set()

    async def acquire(self, partition: int) -> None:
        self.owned.add(partition)

    async def release(self, partition: int) -> None:
        self.owned.discard(partition)


async def test_replicas_share_partitions_and_take_over_from_a_dead_one(nats_connect: Any) -> None:
    nc = await nats_connect()  # admin: a bucket of its own, with a short TTL, next to the session's
    js = nc.jetstream()
    bucket = f"t_leases_{secrets.token_hex(3)}"
    ttl = 2.0
    kv = await js.create_key_value(bucket=bucket, ttl=ttl, history=1, direct=True)
    a, b = Recorder(), Recorder()
    la = PartitionLeases(kv, role="t", replica="a", on_acquire=a.acquire, on_release=a.release, ttl=ttl)
    lb = PartitionLeases(kv, role="t", replica="b", on_acquire=b.acquire, on_release=b.release, ttl=ttl)
    try:
        await la.tick()
        assert len(a.owned) == 16  # alone: everything
        await lb.tick()  # b joins: share is 8, but a still holds all
        await la.tick()  # a sees two members and lets go of 8
        await lb.tick()  # b takes the freed ones
        assert len(a.owned) == 8 and len(b.owned) == 8
        assert a.owned.isdisjoint(b.owned)
        # b dies without a word: its keys expire after the TTL and a takes everything over.
        deadline = time.monotonic() + 10 * ttl
        while len(a.owned) < 16 and time.monotonic() < deadline:
            await asyncio.sleep(ttl / 3)
            await la.tick()
        assert a.owned == set(range(16))
    finally:
        await js.delete_key_value(bucket)
        await nc.close()

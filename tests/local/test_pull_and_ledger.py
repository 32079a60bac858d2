"""The streaming pull consumer and the applier ledger's memory, on a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from nats.js import api as js_api

from applier.ledger import Ledger, seen_key
from contracts.messages import AppliedRecord
from plumbing.pull import StreamingPull

pytestmark = pytest.mark.nats


@pytest.fixture
async def nc(nats_connect: Any) -> AsyncIterator[NATS]:
    client = await nats_connect()
    try:
        yield client
    finally:
        await client.close()


async def _stream_with_consumer(nc: NATS, *, max_ack_pending: int = 1000) -> tuple[str, str]:
    js = nc.jetstream()
    name = "T" + uuid.uuid4().hex[:8].upper()
    await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
    await js.add_consumer(
        name,
        js_api.ConsumerConfig(
            durable_name="c",
            ack_policy=js_api.AckPolicy.EXPLICIT,
            ack_wait=30,
            max_ack_pending=max_ack_pending,
        ),
    )
    return name, name.lower()


async def test_a_lone_message_on_a_quiet_consumer_is_handed_over_at_once(nc: NATS) -> None:
    """The regression: nats.py's fetch(n) held such a message until its pull request expired."""
    stream, prefix = await _stream_with_consumer(nc)
    js = nc.jetstream()
    # The request lives 60 s and asks for 64: a pull that waited for it to fill, or to expire and be made
    # again, would hand nothing over within the 20 s each message is given. 20 s only bounds the wait.
    pull = StreamingPull(nc, stream=stream, durable="c", batch=64, expires=60.0)
    await pull.start()
    try:
        assert await pull.next_batch(timeout=0.3) == []  # quiet: the request stands on the server
        for i in range(5):
            await js.publish(f"{prefix}.x", str(i).encode())
            msgs = await pull.next_batch(timeout=20.0)
            assert [m.data for m in msgs] == [str(i).encode()]
            await msgs[0].ack()
            await asyncio.sleep(0.2)
        await js.delete_stream(stream)
    finally:
        await pull.stop()


async def test_a_burst_arrives_in_order_and_in_batches_no_larger_than_asked(nc: NATS) -> None:
    stream, prefix = await _stream_with_consumer(nc)
    js = nc.jetstream()
    for i in range(300):
        await js.publish(f"{prefix}.x", str(i).encode())
    pull = StreamingPull(nc, stream=stream, durable="c", batch=16, expires=5.0)
    await pull.start()
    try:
        got: list[int] = []
        sizes = []
        deadline = time.monotonic() + 20
        while len(got) < 300 and time.monotonic() < deadline:
            msgs = await pull.next_batch(timeout=1.0)
            sizes.append(len(msgs))
            for m in msgs:
                got.append(int(m.data))
                await m.ack()
        assert got == list(range(300))
        assert max(sizes) <= 16
        await js.delete_stream(stream)
    finally:
        await pull.stop()


async def test_expired_requests_are_renewed(nc: NATS) -> None:
    stream, prefix = await _stream_with_consumer(nc)
    js = nc.jetstream()
    pull = StreamingPull(nc, stream=stream, durable="c", batch=4, expires=0.5, heartbeat=0.2)
    await pull.start()
    try:
        assert await pull.next_batch(timeout=1.5) == []  # several requests expired meanwhile
        await js.publish(f"{prefix}.x", b"late")
        msgs = await pull.next_batch(timeout=3.0)
        assert [m.data for m in msgs] == [b"late"]
        await js.delete_stream(stream)
    finally:
        await pull.stop()


async def test_a_request_lost_with_its_consumer_is_asked_again(nc: NATS) -> None:
    """The consumer goes away under a standing request (as with a leader change): silence, then a new ask."""
    stream, prefix = await _stream_with_consumer(nc)
    js = nc.jetstream()
    pull = StreamingPull(nc, stream=stream, durable="c", batch=4, expires=30.0, heartbeat=0.2)
    await pull.start()
    try:
        assert await pull.next_batch(timeout=0.3) == []
        await js.delete_consumer(stream, "c")
        await js.add_consumer(stream, js_api.ConsumerConfig(durable_name="c", ack_policy=js_api.AckPolicy.EXPLICIT))
        await js.publish(f"{prefix}.x", b"after")
        msgs = await pull.next_batch(timeout=5.0)
        assert [m.data for m in msgs] == [b"after"]
        await js.delete_stream(stream)
    finally:
        await pull.stop()


# ------------------------------------------------------------------------------------------ the ledger


@pytest.fixture
async def ledger_pair(nc: NATS) -> AsyncIterator[tuple[Ledger, Ledger]]:
    """Two appliers' ledgers on one bucket, as two replicas see it."""
    js = nc.jetstream()
    bucket = "L" + uuid.uuid4().hex[:8]
    kv = await js.create_key_value(bucket=bucket, history=1)
    try:
        yield Ledger(kv), Ledger(await js.key_value(bucket))
    finally:
        with contextlib.suppress(Exception):
            await js.delete_key_value(bucket)


def _record(version: int) -> AppliedRecord:
    return AppliedRecord(source_version=version, source_seq=version, digest=f"d{version}", state="applied")


async def test_a_remembered_record_is_served_without_asking_and_an_unseen_key_may_be_assumed_absent(
    ledger_pair: tuple[Ledger, Ledger],
) -> None:
    a, _ = ledger_pair
    assert await a.read("ns.jobset.x", assume_absent=True) == (None, 0)
    revision = await a.write("ns.jobset.x", _record(5), revision=0)
    assert revision
    await a.kv.purge("ns.jobset.x")  # behind its back: only a fresh read notices
    assert await a.read("ns.jobset.x") == (_record(5), revision)
    assert (await a.read_fresh("ns.jobset.x"))[0] is None


async def test_a_wrong_memory_only_fails_the_compare_and_set(ledger_pair: tuple[Ledger, Ledger]) -> None:
    a, b = ledger_pair
    key = "ns.jobset.y"
    first = await a.write(key, _record(5), revision=0)
    assert first is not None
    # Replica b (a partition handover) writes a newer record; a still remembers the old one.
    seen, revision = await b.read_fresh(key)
    assert seen == _record(5)
    assert await b.write(key, _record(9), revision=revision) is not None
    remembered, old_revision = await a.read(key)
    assert remembered == _record(5)
    assert await a.write(key, _record(6), revision=old_revision) is None  # the stale memory loses ...
    assert await a.read(key) == await a.read_fresh(key)  # ... and is forgotten
    assert (await a.read(key))[0] == _record(9)
    # Assuming a key absent that is not: the create fails the same way.
    assert await b.write("ns.cm.z", _record(1), revision=0) is not None
    record, revision = await a.read("ns.cm.z", assume_absent=True)
    assert (record, revision) == (None, 0)
    assert await a.write("ns.cm.z", _record(2), revision=revision) is None
    assert (await a.read("ns.cm.z"))[0] == _record(1)


async def test_the_memory_is_bounded(nc: NATS) -> None:
    js = nc.jetstream()
    bucket = "L" + uuid.uuid4().hex[:8]
    kv = await js.create_key_value(bucket=bucket, history=1)
    try:
        ledger = Ledger(kv, remember=3)
        for i in range(5):
            await ledger.write(f"k{i}", _record(i + 1), revision=0)
        assert await ledger.read("k0", assume_absent=True) == (None, 0)  # forgotten: oldest first
        assert (await ledger.read("k4", assume_absent=True))[0] == _record(5)
    finally:
        await js.delete_key_value(bucket)


async def test_of_racing_appliers_exactly_one_sees_a_trainjob_first_and_a_new_uid_counts_again(
    ledger_pair: tuple[Ledger, Ledger],
) -> None:
    """What ``kubeflow_trainer_trainjobs_created_total`` counts: one True per uid, however many ask, however often."""
    a, b = ledger_pair
    key = seen_key("ns", "mnist")
    firsts = await asyncio.gather(*(ledger.first_sight(key, "uid-1") for ledger in (a, b, a, b)))
    assert sorted(firsts) == [False, False, False, True]
    assert not await a.first_sight(key, "uid-1") and not await b.first_sight(key, "uid-1")
    restarted = Ledger(a.kv)  # an applier started anew remembers nothing; the bucket does
    assert not await restarted.first_sight(key, "uid-1")
    # The TrainJob deleted and made again under its name: a new uid, counted once more.
    again = await asyncio.gather(*(ledger.first_sight(key, "uid-2") for ledger in (a, b, restarted)))
    assert sorted(again) == [False, False, True]

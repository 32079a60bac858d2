"""``tjpipe bus-setup`` over a bus made by the previous version, on a real nats-server.

The previous version kept every stream with limits retention and no history streams, so a work stream at
its byte limit stayed full of acknowledged messages. The set-up must record all of it in the new history
streams, then let the work streams drop what is acknowledged (room at once), keep what is not, keep the
durables where they were, and do nothing more when run again.
"""

from __future__ import annotations

from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.js import api as js_api

from contracts import streams, subjects
from contracts.subjects import PARTITIONS
from plumbing import bus_history, bus_setup, publishing
from tjpipe.local.natsd import start_nats

pytestmark = pytest.mark.nats

LIMIT = 6_000


async def old_bus(js: nats.js.JetStreamContext) -> None:
    """The streams and durables as the previous version's set-up made them."""
    for spec in (streams.EVENTS, streams.APPLY, streams.RESULTS, streams.DLQ):
        await js.add_stream(
            js_api.StreamConfig(
                name=spec.name,
                subjects=list(spec.subjects),
                retention=js_api.RetentionPolicy.LIMITS,
                storage=js_api.StorageType.FILE,
                max_age=spec.max_age_seconds,
                max_bytes=LIMIT if spec is streams.APPLY else -1,
                discard=js_api.DiscardPolicy.OLD if spec is streams.RESULTS else js_api.DiscardPolicy.NEW,
                allow_direct=True,
            )
        )
    for spec in (streams.PLANNER, streams.APPLIER):
        for p in range(PARTITIONS):
            await bus_setup.ensure_consumer(js, bus_setup.partition_consumer(spec, p))


async def drain(js: nats.js.JetStreamContext, spec: streams.ConsumerSpec, partitions: range) -> int:
    done = 0
    for p in partitions:
        durable = bus_setup.partition_consumer(spec, p)
        sub = await js.pull_subscribe_bind(durable.durable, stream=spec.stream)
        while True:
            try:
                msgs = await sub.fetch(50, timeout=0.5)
            except TimeoutError:  # nats' own and asyncio's: nothing (more) to fetch
                break
            for msg in msgs:
                await msg.ack_sync()
                done += 1
        await sub.unsubscribe()
    return done


async def test_bus_setup_upgrades_an_old_bus_without_losing_history_or_wedging(tmp_path: Path) -> None:
    server = start_nats(store_dir=tmp_path / "store", log_dir=tmp_path / "logs", name="nats-upgrade")
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await old_bus(js)
        for i in range(24):
            await js.publish(subjects.event_subject("ns", f"job-{i}"), b"event %d" % i)
        applies = 0
        with pytest.raises(nats.js.errors.APIError) as full:
            while True:
                await js.publish(subjects.apply_subject("ns", f"job-{applies}", "jobset"), b"p" * 300)
                applies += 1
        assert publishing.is_refused(full.value)  # the old wedge: full of work long done, once acked
        assert await drain(js, streams.APPLIER, range(PARTITIONS)) == applies
        planned = await drain(js, streams.PLANNER, range(PARTITIONS // 2))
        assert 0 < planned < 24
        with pytest.raises(nats.js.errors.APIError):
            await js.publish(subjects.apply_subject("ns", "late", "jobset"), b"p" * 300)

        environ = {"TJPIPE_APPLY_MAX_BYTES": str(LIMIT)}
        await bus_setup.setup_bus(js, streams.configured_streams(environ))

        events = await js.stream_info(streams.EVENTS.name)
        assert events.config.retention == js_api.RetentionPolicy.INTEREST
        assert events.state.messages == 24 - planned  # what the planner had not done stays
        apply_info = await js.stream_info(streams.APPLY.name)
        assert apply_info.config.retention == js_api.RetentionPolicy.INTEREST
        assert apply_info.state.messages == 0 and apply_info.config.max_bytes == LIMIT  # room, same limit
        # Every message of the old streams is in the history, with its subject and its old sequence.
        recorded = await bus_history.read_stream(js, streams.EVENTS_HISTORY.name, subjects.events_filter())
        assert sorted(m.data for m in recorded) == sorted(b"event %d" % i for i in range(24))
        assert sorted(m.origin_seq for m in recorded) == list(range(1, 25))
        recorded_applies = await bus_history.read_stream(js, streams.APPLY_HISTORY.name, subjects.apply_filter())
        assert len(recorded_applies) == applies
        # The durables are where they were: the undone events come next, nothing is delivered again.
        assert await drain(js, streams.PLANNER, range(PARTITIONS)) == 24 - planned
        assert (await js.stream_info(streams.EVENTS.name)).state.messages == 0

        # Work flows: a new plan is stored, applied, gone from the work stream and kept in the history.
        await js.publish(subjects.apply_subject("ns", "late", "jobset"), b"p" * 300)
        assert await drain(js, streams.APPLIER, range(PARTITIONS)) == 1

        # Run again: nothing is copied twice, nothing changes.
        await bus_setup.setup_bus(js, streams.configured_streams(environ))
        again = await bus_history.read_stream(js, streams.EVENTS_HISTORY.name, subjects.events_filter())
        assert len(again) == 24
        late = await bus_history.read_stream(js, streams.APPLY_HISTORY.name, subjects.apply_filter())
        assert len(late) == applies + 1
        await nc.close()
    finally:
        server.stop()

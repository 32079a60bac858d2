"""``tjpipe history`` over a real nats-server when records cannot be decoded.

The unit test (test_units.py) hands ``ops.history`` canned records; here the same records are published to
the streams the services write (the event, the plan, the result, two dead letters) and the command reads
them back through NATS as a subprocess, so the stream names, subject filters and stored times it relies on
are the server's, not the test's.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from contracts import streams, subjects
from contracts.messages import DeadLetter, encode
from plumbing import bus as plumbing_bus

from .conftest import Bus
from .support import tjpipe

pytestmark = [pytest.mark.nats]


def test_history_shows_each_undecodable_record_as_its_own_line(own_bus: Bus) -> None:
    namespace, name = "cli-undecodable", "a"
    letter = DeadLetter(stage="applier", reason="permanent", error="422", subject="s", payload=b"{}")

    async def record() -> None:
        nc = await plumbing_bus.connect(own_bus.url, name="test-record", creds=own_bus.credentials.seed_file("admin"))
        try:
            js = nc.jetstream()

            async def stored(subject: str, payload: bytes) -> None:
                # One at a time, so their stored times give the order the history sorts by. An event or a plan
                # is read from its history stream, which the server copies from the work stream on its own
                # time: the next record waits until the copy is stored, or the copy could be stamped after it.
                ack = await js.publish(subject, payload)
                history = streams.HISTORY_OF.get(ack.stream)
                for _ in range(500):
                    if history is None or (await js.stream_info(history)).state.last_seq >= ack.seq:
                        return
                    await asyncio.sleep(0.01)
                raise AssertionError(f"{history} never copied message {ack.seq} of {ack.stream}")

            await stored(subjects.event_subject(namespace, name), b"{not json")
            await stored(subjects.apply_subject(namespace, name, "jobset"), b"{not json")
            await stored(subjects.result_subject(namespace, name, "jobset"), b"{not json")
            await stored(subjects.dlq_subject("applier", namespace, name), b"[]")
            await stored(subjects.dlq_subject("applier", namespace, name), encode(letter))
        finally:
            await nc.close()

    asyncio.run(record())
    done = tjpipe("history", f"{namespace}/{name}", "-o", "json", env=own_bus.env())
    assert (done.returncode, done.stderr) == (0, "")
    rows = json.loads(done.stdout)
    assert [(r["kind"], r["summary"]) for r in rows] == [
        ("event", "undecodable event"),
        ("plan", "undecodable apply message"),
        ("result", "undecodable apply result"),
        ("dead-letter", "undecodable dead letter"),
        ("dead-letter", "applier: permanent: 422"),
    ]
    assert [r["stream"] for r in rows] == ["TJ_EVENTS", "TJ_APPLY", "TJ_RESULTS", "TJ_DLQ", "TJ_DLQ"]

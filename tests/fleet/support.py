"""Records published and read the way the pipeline does, for the fleet tests (the servers: ``tjpipe.local.fleet``)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

from nats.aio.client import Client as NATS

from contracts import fleet as fleet_contract
from contracts import streams, subjects
from plumbing import bus, bus_history, bus_setup
from tjpipe import fleet_nats
from tjpipe.local.fleet import LocalFleet as Fleet
from tjpipe.local.fleet import LocalMember as Member

__all__ = ["Fleet", "Member"]


# ------------------------------------------------------------------------------------ records, as the pipeline

NAMESPACE = "team-a"
EVENTS_FLEET = fleet_contract.FLEET_OF[streams.EVENTS_HISTORY.name]
RESULTS_FLEET = fleet_contract.FLEET_OF[streams.RESULTS.name]


async def publish_records(member: Member, *, start: int, count: int, tag: str = "") -> None:
    """``count`` events (as the watcher) and as many results (as the applier), numbered from ``start``."""
    watcher, applier = await member.connect("watcher"), await member.connect("applier")
    try:
        wjs, ajs = watcher.jetstream(), applier.jetstream()
        for n in range(start, start + count):
            name = f"job-{n % 7}"
            body = json.dumps({"cluster": member.cluster, "n": n, "tag": tag}).encode()
            msg_id = f"{member.cluster}-uid-{n}"
            ack = await wjs.publish(subjects.event_subject(NAMESPACE, name), body, headers={bus.MSG_ID: msg_id})
            # Answered by the member's own JetStream, in its own domain, link or no link.
            assert (ack.stream, ack.domain, bool(ack.duplicate)) == (streams.EVENTS.name, member.cluster, False), ack
            await ajs.publish(subjects.result_subject(NAMESPACE, name, "jobset"), body)
    finally:
        await watcher.close()
        await applier.close()


async def publish_large_results(member: Member, *, count: int, size: int) -> None:
    """``count`` results of about ``size`` bytes each, as the applier records them, over 50 TrainJobs: bytes
    enough to make the member's JetStream ask the hub for flow control (past 1 MiB unanswered), or to pass a
    member's quota at the hub."""
    applier = await member.connect("applier")
    try:
        js = applier.jetstream()
        for n in range(count):
            body = json.dumps({"cluster": member.cluster, "n": n, "pad": "x" * size}).encode()
            await js.publish(subjects.result_subject(NAMESPACE, f"big-{n % 50}", "jobset"), body)
    finally:
        await applier.close()


async def hub_records(servers: Fleet, kind: str) -> list[bus_history.StoredMessage]:
    """The hub's copies of one kind of record (``FLEET_EVENTS_HISTORY``), every member's stream of it in turn."""
    (origin,) = [spec.origin for spec in fleet_contract.FLEET_STREAMS if spec.name == kind]
    reader = await servers.hub_connect(fleet_nats.HUB_READER)
    try:
        out: list[bus_history.StoredMessage] = []
        for cluster in servers.members:
            name = fleet_contract.fleet_stream(origin, cluster)
            out += await bus_history.read_stream(reader.jetstream(), name, f"{fleet_contract.PREFIX}.>")
        return out
    finally:
        await reader.close()


async def until_hub_holds(
    servers: Fleet, stream: str, count: int, *, timeout: float
) -> list[bus_history.StoredMessage]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        records = await hub_records(servers, stream)
        if len(records) >= count or loop.time() > deadline:
            return records
        await asyncio.sleep(0.25)


def check_exact(records: list[bus_history.StoredMessage], expected: dict[str, int]) -> None:
    """Each cluster's records: exactly ``expected[cluster]``, its own, origin sequences 1..N with no gap or double."""
    by_cluster: dict[str, list[bus_history.StoredMessage]] = {}
    for record in records:
        cluster, original = fleet_contract.cluster_of(record.subject)
        assert original.startswith("tj."), record.subject
        body = json.loads(record.data)
        assert body["cluster"] == cluster, f"{cluster}'s name on a record of {body['cluster']}: {record.subject}"
        by_cluster.setdefault(cluster, []).append(record)
    assert {c: len(v) for c, v in by_cluster.items()} == expected
    for cluster, mine in by_cluster.items():
        origin = [record.origin_seq for record in mine]
        assert origin == list(range(1, expected[cluster] + 1)), f"{cluster}: gaps or doubles in {origin}"
        numbers = Counter(json.loads(record.data)["n"] for record in mine)
        assert set(numbers.values()) == {1}, f"{cluster}: a record stored twice"
        assert sorted(numbers) == list(range(expected[cluster]))


async def pass_work_along(member: Member) -> tuple[int, int]:
    """Do what the planner and applier do with the member's work streams, through their own durables and
    identities: take every pending event, plan one apply message for it, take that and record a result.
    Returns (events taken, apply messages taken)."""
    planner, applier = await member.connect("planner"), await member.connect("applier")
    try:
        planned = await _take_all(planner, streams.PLANNER, forward=subjects.APPLY_PREFIX)
        applied = await _take_all(applier, streams.APPLIER, forward=None)
        return planned, applied
    finally:
        await planner.close()
        await applier.close()


async def _take_all(nc: NATS, spec: streams.ConsumerSpec, *, forward: str | None) -> int:
    js = nc.jetstream()
    taken = 0
    for partition in range(subjects.PARTITIONS):
        durable = bus_setup.partition_consumer(spec, partition).durable
        info = await js.consumer_info(spec.stream, durable)
        if not info.num_pending and not info.num_ack_pending:
            continue
        sub = await js.pull_subscribe_bind(durable, spec.stream)
        try:
            while True:
                try:
                    batch = await sub.fetch(100, timeout=0.5)
                except TimeoutError:
                    break
                for msg in batch:
                    if forward is not None:
                        namespace, name = subjects.trainjob_of_subject(msg.subject)
                        ack = await js.publish(subjects.apply_subject(namespace, name, "jobset"), msg.data)
                        assert ack.stream == streams.APPLY.name
                    else:
                        namespace, name = subjects.trainjob_of_subject(msg.subject)
                        await js.publish(subjects.result_subject(namespace, name, "applied"), msg.data)
                    await msg.ack_sync()
                    taken += 1
        finally:
            await sub.unsubscribe()
    return taken

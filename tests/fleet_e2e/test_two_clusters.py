"""Issue #37 end to end: two simulated clusters run TrainJobs with their own pipelines, and the hub holds
every record of both, each under its cluster's name, through a minute with one member cut off under load.

What is asserted is behaviour: TrainJobs reach Trainer's Complete in each cluster; the hub's fleet streams,
read the way the fleet's history server reads them (``history_server.fleet.FleetIndex``, as
``fleet-reader``), show each TrainJob Complete under its own cluster, and the same namespace and name in both
clusters as two TrainJobs; while c1's leaf link is down, c1 keeps building and completing TrainJobs and
nothing of it reaches the hub; once the link is back, every record of every record stream of both members
is at the hub exactly once (counted by the member stream's sequence: 1..N, no gap, no double). The hub's lag
behind each member (its stored time minus the member's, both the servers' own timestamps) is printed, never
asserted. Every wait has a bound; loopback only; the load is bounded (``RATE`` per member for ``CUT_SECONDS``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from faults.support import Pipeline, condition_of, trainjob, until, until_async

from contracts import fleet as fleet_contract
from contracts import streams
from history_server.fleet import FleetIndex
from plumbing import bus_history
from tjpipe import fleet_nats

from .support import CLUSTERS, NAMESPACE, RECORD_STREAMS, World, copy_problems, origin_seqs

pytestmark = [pytest.mark.cluster, pytest.mark.nats]

SHARED = ("shared-0", "shared-1", "shared-2")
"""Names created in both clusters: at the hub, two TrainJobs each."""
OWN = {"c1": "only-c1", "c2": "only-c2"}
CUT_SECONDS = 60.0
RATE = 1.0
"""TrainJobs created per second in each member while c1 is cut off."""
COMPLETE_WITHIN = 240.0
HUB_WITHIN = 240.0
"""How long the hub may take to hold everything; the hub's retries of a source back off while a link is down,
to about two minutes between attempts (docs/fleet.md)."""
LINK_WITHIN = 60.0
"""How long the member's server may take to show its leaf link down or up again after a reload."""
EVENTS_HISTORY = streams.EVENTS_HISTORY.name


def complete(p: Pipeline, names: list[str]) -> list[str]:
    """Those of ``names`` whose TrainJob has Trainer's Complete condition."""
    trainjobs = p.trainjobs()
    return [
        n for n in names if n in trainjobs and (condition_of(trainjobs[n], "Complete") or {}).get("status") == "True"
    ]


async def all_complete(p: Pipeline, names: list[str], *, what: str) -> None:
    def check() -> bool:
        done = complete(p, names)
        if len(done) < len(names):
            raise AssertionError(f"{len(done)}/{len(names)} Complete; not yet: {sorted(set(names) - set(done))[:10]}")
        return True

    try:
        await until(check, timeout=COMPLETE_WITHIN, what=what, interval=1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{p.log_tails(20)}") from None


def uids(p: Pipeline, names: list[str]) -> dict[str, str]:
    trainjobs = p.trainjobs()
    return {n: trainjobs[n]["metadata"]["uid"] for n in names}


class HubView:
    """The hub's fleet streams as the fleet's history server folds them (one index per cluster)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.index = FleetIndex(CLUSTERS)

    async def catch_up(self) -> None:
        reader = await self.world.fleet.hub_connect(fleet_nats.HUB_READER)
        try:
            await self.index.catch_up(reader.jetstream())
        finally:
            await reader.close()

    def shows(self, cluster: str, expected: dict[str, str]) -> list[str]:
        """What is missing or wrong of ``expected`` (name → uid) at the hub under ``cluster``: each must be
        there with that uid and Complete."""
        wrong = []
        for name, uid in expected.items():
            summary = self.index.clusters[cluster].get(NAMESPACE, name)
            if summary is None or summary.uid != uid or summary.state != "Complete":
                seen = None if summary is None else (summary.uid, summary.state)
                wrong.append(f"{cluster}/{NAMESPACE}/{name}: {seen}")
        return wrong

    async def until_shows(self, expected: dict[str, dict[str, str]], *, timeout: float) -> None:
        async def check() -> bool:
            await self.catch_up()
            wrong = [w for cluster, jobs in expected.items() for w in self.shows(cluster, jobs)]
            if wrong:
                raise AssertionError(f"{len(wrong)} not (yet) Complete at the hub: {wrong[:6]}")
            return True

        await until_async(check, timeout=timeout, what="every TrainJob Complete at the hub", interval=1.0)


async def hub_records(world: World, origin: str) -> list[bus_history.StoredMessage]:
    """The hub's copies of every member's record stream ``origin`` (each member's fleet stream of it), by
    direct get as ``fleet-reader``."""
    reader = await world.fleet.hub_connect(fleet_nats.HUB_READER)
    try:
        out: list[bus_history.StoredMessage] = []
        for cluster in CLUSTERS:
            name = fleet_contract.fleet_stream(origin, cluster)
            out += await bus_history.read_stream(reader.jetstream(), name, f"{fleet_contract.PREFIX}.>")
        return out
    finally:
        await reader.close()


async def member_records(world: World, cluster: str, stream: str) -> tuple[int, list[bus_history.StoredMessage]]:
    """(first sequence, records) of a member's record stream, read as its ``reader``."""
    reader = await world.members[cluster].server.connect("reader")
    try:
        js = reader.jetstream()
        first = int((await js.stream_info(stream)).state.first_seq or 0)
        return first, await bus_history.read_stream(js, stream, ">")
    finally:
        await reader.close()


async def hub_holds_everything(world: World) -> dict[str, dict[str, int]]:
    """Every record of every member's record streams at the hub once (``copy_problems``). Raises with what
    differs; else the counts per stream and cluster."""
    counts: dict[str, dict[str, int]] = {}
    problems = []
    for origin in RECORD_STREAMS:
        at_hub = origin_seqs(await hub_records(world, origin))
        held = {}
        for cluster in CLUSTERS:
            first, mine = await member_records(world, cluster, origin)
            held[cluster] = (first, mine[-1].seq if mine else 0)
            counts.setdefault(origin, {})[cluster] = len(at_hub.get(cluster, []))
        problems += copy_problems(origin, at_hub, held)
    if problems:
        raise AssertionError("; ".join(problems))
    return counts


async def lags(world: World, *, cut_at: float | None = None) -> dict[str, list[float]]:
    """The hub's lag per record (its stored time minus the member's, both the servers' own timestamps), by
    member; c1's records stored from the moment its link was cut (``cut_at``, wall clock) apart, under
    ``c1 cut, then caught up``: their lag is the outage and the catch-up, not the copying."""
    out: dict[str, list[float]] = {}
    for origin in RECORD_STREAMS:
        at_hub = {
            (fleet_contract.cluster_of(r.subject)[0], r.origin_seq): r.time for r in await hub_records(world, origin)
        }
        for cluster in CLUSTERS:
            for record in (await member_records(world, cluster, origin))[1]:
                copied = at_hub.get((cluster, record.seq))
                if copied is None:
                    continue
                after_cut = cut_at is not None and cluster == "c1" and record.time >= cut_at
                out.setdefault(f"{cluster} cut, then caught up" if after_cut else cluster, []).append(
                    copied - record.time
                )
    return out


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear between closest ranks (as ``bench.stats`` computes it)."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def describe_lags(values: dict[str, list[float]]) -> str:
    parts = []
    for who, lag in sorted(values.items()):
        p50, p99 = percentile(lag, 50), percentile(lag, 99)
        parts.append(
            f"{who}: p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {max(lag):.2f} s ({len(lag)} records)"
        )
    return "; ".join(parts)


# ------------------------------------------------------------------------------------------------ the tests


@pytest.mark.timeout(900)
async def test_trainjobs_of_both_clusters_complete_and_reach_the_hub_under_their_own_cluster(
    world: World, uncaptured_progress: Callable[[str], None]
) -> None:
    names = {cluster: [*SHARED, OWN[cluster]] for cluster in CLUSTERS}
    for cluster in CLUSTERS:
        for name in names[cluster]:
            world.members[cluster].pipe.create(trainjob(name, num_nodes=1))
    for cluster in CLUSTERS:
        await all_complete(world.members[cluster].pipe, names[cluster], what=f"{cluster}'s TrainJobs Complete")
    expected = {cluster: uids(world.members[cluster].pipe, names[cluster]) for cluster in CLUSTERS}
    # The same namespace and name in both clusters are two TrainJobs: their own uids, each under its cluster.
    assert all(expected["c1"][n] != expected["c2"][n] for n in SHARED), expected

    hub = HubView(world)
    await hub.until_shows(expected, timeout=HUB_WITHIN)
    for cluster in CLUSTERS:
        listed = {s.name: s.uid for s in hub.index.clusters[cluster].in_namespace(NAMESPACE)}
        assert listed == expected[cluster], f"{cluster} at the hub: {listed}"
    assert hub.index.foreign == 0
    uncaptured_progress(f"fleet e2e: hub lag while linked: {describe_lags(await lags(world))}")


@pytest.mark.timeout(900)
async def test_a_member_cut_off_for_a_minute_under_load_keeps_completing_and_the_hub_gets_every_record_once(
    world: World, uncaptured_progress: Callable[[str], None]
) -> None:
    c1 = world.members["c1"]
    hub = HubView(world)
    await until_async(lambda: _caught_up(world), timeout=HUB_WITHIN, what="the hub caught up before the cut")
    c1.server.set_link(False, timeout=LINK_WITHIN)
    cut_started = time.time()
    before = origin_seqs(await hub_records(world, EVENTS_HISTORY))

    # The load: RATE TrainJobs a second in each member for CUT_SECONDS, the same names in both.
    names: list[str] = []
    completed_during: dict[str, list[tuple[int, int]]] = {cluster: [] for cluster in CLUSTERS}
    started = time.monotonic()
    next_check = started + 5
    while (elapsed := time.monotonic() - started) < CUT_SECONDS:
        name = f"load-{len(names):03d}"
        for member in world.members.values():
            member.pipe.create(trainjob(name, num_nodes=1))
        names.append(name)
        if time.monotonic() >= next_check:
            for cluster, member in world.members.items():
                completed_during[cluster].append((round(elapsed), len(complete(member.pipe, names))))
            next_check += 5
        await asyncio.sleep(max(0.0, started + len(names) / RATE - time.monotonic()))
    uncaptured_progress(
        f"fleet e2e: {len(names)} TrainJobs created in each member in {time.monotonic() - started:.0f}s"
    )

    # Still cut off: c1 completes every one of them, and nothing of it has reached the hub.
    await all_complete(c1.pipe, names, what="c1's TrainJobs Complete while its link is down")
    assert c1.server.leaf_count() == 0, "c1's leaf link came back before the test healed it"
    during = origin_seqs(await hub_records(world, EVENTS_HISTORY))
    c1_before, c1_during = before.get("c1", []), during.get("c1", [])
    assert c1_during == c1_before, f"c1's events reached the hub while cut: {len(c1_before)} → {len(c1_during)}"
    assert len(during.get("c2", [])) > len(before.get("c2", [])), "c2's events stopped reaching the hub meanwhile"
    c1.server.set_link(True, timeout=LINK_WITHIN)
    healed = time.time()
    uncaptured_progress(
        f"fleet e2e: c1 cut off for {healed - cut_started:.0f}s; Complete during the load (seconds into it, "
        f"count): {completed_during}; c1's {len(names)} all Complete before its link came back"
    )
    for cluster, samples in completed_during.items():
        assert any(count for _, count in samples), f"no TrainJob of {cluster} was Complete during the load"

    await all_complete(world.members["c2"].pipe, names, what="c2's TrainJobs Complete")
    counts = await until_async(
        lambda: hub_holds_everything(world), timeout=HUB_WITHIN, what="every record of both members at the hub once"
    )
    uncaptured_progress(
        f"fleet e2e: the hub holds every record once {time.time() - healed:.0f}s after c1's link came back: {counts}"
    )

    expected = {cluster: uids(world.members[cluster].pipe, names) for cluster in CLUSTERS}
    await hub.until_shows(expected, timeout=60)
    assert all(expected["c1"][n] != expected["c2"][n] for n in names)
    dead = {c: sum(s.dead_letters for s in hub.index.clusters[c].in_namespace(NAMESPACE)) for c in CLUSTERS}
    assert dead == dict.fromkeys(CLUSTERS, 0), f"dead letters at the hub: {dead}"
    uncaptured_progress(f"fleet e2e: hub lag under load: {describe_lags(await lags(world, cut_at=cut_started))}")


async def _caught_up(world: World) -> bool:
    nc = await world.fleet.hub_connect()
    try:
        await fleet_nats.wait_caught_up(nc.jetstream(), timeout=30)
    finally:
        await nc.close()
    return True

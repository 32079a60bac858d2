"""The compose fleet on a real Docker engine: a hub (compose/fleet.yml) and two members, each a whole lone-cluster
stack (compose/docker-compose.yml with compose/fleet-member.yml) in its own project, as
scripts/compose-fleet.sh runs them.

What is asserted is behaviour: each member runs its demo to Complete on its own simulated cluster and
pipeline (the same namespace and names in both); the hub, read from the host as ``fleet-reader`` over the
published TLS port with the files fleet-init gave the host folder, shows each demo TrainJob under its own
cluster with that cluster's uid (two TrainJobs of one name), holds every record of every member record stream
exactly once (the member's sequences 1..N, as tests/fleet_e2e counts them), and ``tjpipe history --cluster``
prints a member's timeline from the hub; a wildcard in place of a cluster's name is refused, and a name no
member has shows nothing. The three projects and the fleet's network are removed at the end.

Every wait is bounded. The hub and its network are this run's own (a random project and network name, free
host ports), so a fleet started by hand is never touched.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fleet_e2e.support import RECORD_STREAMS, copy_problems, origin_seqs
from nats.aio.client import Client as NATS
from needs import unavailable

from contracts import fleet as fleet_contract
from history_server.fleet import FleetIndex
from plumbing import bus, bus_history
from tjpipe.local import compose
from tjpipe.local.procs import free_port

from .support import COMPOSE_FILE, Project, build_images, compose_tools, engine_problem

pytestmark = pytest.mark.timeout(2400)

FLEET_FILE = COMPOSE_FILE.parent / "fleet.yml"
MEMBER_FILE = COMPOSE_FILE.parent / "fleet-member.yml"
CLUSTERS = ("c1", "c2")
DEMO = ("mnist", "deepspeed")
DEMO_NAMESPACE = "tjpipe-demo"
DEMO_TIMEOUT = 900.0
HUB_WITHIN = 240.0
"""How long the hub may take to hold every record once the demos are done: a source that found its member not
yet joined backs off between attempts (docs/fleet.md)."""


def _say(line: str) -> None:
    print(f"[compose fleet] {line}", flush=True)


@dataclass
class ComposeFleet:
    hub: Project
    members: dict[str, Project]
    state: Path
    """The host folder fleet-init writes into (TJPIPE_FLEET_STATE)."""
    hub_port: int
    network: str

    async def reader(self) -> NATS:
        """The hub from the host, as ``fleet-reader``, with the seed and CA fleet-init gave the host folder."""
        tls = bus.TlsFiles(ca=str(self.state / "hub-ca.crt"))
        url = f"tls://127.0.0.1:{self.hub_port}"
        return await bus.connect(url, name="compose-fleet-test", creds=self.state / "fleet-reader.nk", tls=tls)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeFleet]:
    problem = engine_problem()
    if problem is not None:
        unavailable(problem)
    build_images(_say)
    tools = compose_tools(None) or compose_tools(compose.ensure_compose_v2(progress=_say))
    tool = next(iter(tools.values()))
    root = tmp_path_factory.mktemp("compose-fleet")
    state = root / "fleet-state"
    state.mkdir()
    network = f"tjtest{secrets.token_hex(4)}-fleet"
    hub_port = free_port()
    shared = {"TJPIPE_FLEET_STATE": str(state), "TJPIPE_FLEET_NETWORK": network}
    hub = Project(
        tool=tool,
        state=root / "hub-unused",
        main_file=FLEET_FILE,
        options=["--profile", "fleet"],
        settings={**shared, "TJPIPE_FLEET_HUB_PORT": str(hub_port)},
    )
    members = {
        c: Project(
            tool=tool,
            state=root / f"state-{c}",
            overrides=[MEMBER_FILE],
            settings={**shared, "TJPIPE_FLEET_CLUSTER": c},
        )
        for c in CLUSTERS
    }
    world = ComposeFleet(hub=hub, members=members, state=state, hub_port=hub_port, network=network)
    started = time.monotonic()
    try:
        hub.run("up", "-d", timeout=600)
        code = hub.wait_exited("fleet-setup", timeout=300)
        assert code == 0, hub.logs("fleet-init", "fleet-setup")[-4000:]
        _say(f"hub up, fleet streams set up, in {time.monotonic() - started:.0f}s (project {hub.name})")
        with concurrent.futures.ThreadPoolExecutor(len(members)) as pool:
            for done in [pool.submit(m.run, "up", "-d", timeout=900) for m in members.values()]:
                done.result()
        _say(f"both members up {time.monotonic() - started:.0f}s after the hub started")
        yield world
    finally:
        for member in members.values():
            member.down()
        hub.down()


def test_both_members_run_their_demo_and_the_hub_holds_every_record_once_under_its_cluster(
    fleet: ComposeFleet,
) -> None:
    started = time.monotonic()
    for cluster, member in fleet.members.items():
        code = member.wait_exited("demo", timeout=DEMO_TIMEOUT)
        logs = member.logs("demo")
        assert code == 0, f"{cluster}'s demo:\n{logs[-4000:]}"
        for name in DEMO:
            assert f"TrainJob {DEMO_NAMESPACE}/{name} is Complete" in logs, f"{cluster}: {logs[-3000:]}"
    _say(f"both demos Complete and cleaned up {time.monotonic() - started:.0f}s after the members' up")

    counts = asyncio.run(_until_hub_holds_everything(fleet))
    _say(f"the hub holds every record once {time.monotonic() - started:.0f}s after the demos began: {counts}")

    index = asyncio.run(_fleet_index(fleet))
    uids = {}
    for cluster in CLUSTERS:
        listed = {s.name: s for s in index.clusters[cluster].in_namespace(DEMO_NAMESPACE)}
        assert set(listed) == set(DEMO), f"{cluster} at the hub: {sorted(listed)}"
        # The demo deletes its TrainJobs once Complete: the hub's history keeps them, as deleted.
        assert {s.state for s in listed.values()} == {"Deleted"}, {n: s.state for n, s in listed.items()}
        uids[cluster] = {name: s.uid for name, s in listed.items()}
    assert all(uids["c1"][n] and uids["c1"][n] != uids["c2"][n] for n in DEMO), uids
    assert index.foreign == 0


def test_the_history_command_reads_a_members_timeline_at_the_hub(fleet: ComposeFleet) -> None:
    for cluster, member in fleet.members.items():
        assert member.wait_exited("demo", timeout=DEMO_TIMEOUT) == 0
        table = _tjpipe(fleet, "history", "--cluster", cluster, f"{DEMO_NAMESPACE}/mnist")
        assert table.returncode == 0, table.stdout + table.stderr
        assert f"history of TrainJob {DEMO_NAMESPACE}/mnist in cluster {cluster}" in table.stdout, table.stdout
        shown = _tjpipe(fleet, "history", "--cluster", cluster, "-o", "json", f"{DEMO_NAMESPACE}/mnist")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        timeline = json.loads(shown.stdout)
        assert _complete_condition(timeline), f"no Complete condition in {cluster}'s timeline: {shown.stdout[-3000:]}"
    # A wildcard is never a cluster's name: refused before the bus is asked anything.
    wildcard = _tjpipe(fleet, "history", "--cluster", "c1.>", f"{DEMO_NAMESPACE}/mnist")
    assert wildcard.returncode == 2 and "--cluster" in wildcard.stderr, wildcard.stdout + wildcard.stderr
    # A name no member has: nothing of any other cluster is shown under it.
    unknown = _tjpipe(fleet, "history", "--cluster", "c3", f"{DEMO_NAMESPACE}/mnist")
    assert unknown.returncode != 0 and "Complete" not in unknown.stdout, unknown.stdout + unknown.stderr


def test_down_leaves_no_container_volume_or_network_of_the_three_projects(fleet: ComposeFleet) -> None:
    for member in fleet.members.values():
        member.down()
    fleet.hub.down()
    for project in (fleet.hub, *fleet.members.values()):
        assert project.leftovers() == {"containers": [], "volumes": [], "networks": []}, project.name
    named = subprocess.run(
        ["docker", "network", "ls", "-q", "--filter", f"name=^{fleet.network}$"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert named.stdout.split() == [], f"the fleet's network {fleet.network} is left"


def _complete_condition(value: Any) -> bool:
    """Whether an event of the timeline (``tjpipe history -o json``) shows the TrainJob ``Complete``."""
    if isinstance(value, dict):
        detail = value.get("detail")
        if value.get("kind") == "event" and isinstance(detail, dict) and detail.get("state") == "Complete":
            return True
        return any(_complete_condition(v) for v in value.values())
    if isinstance(value, list):
        return any(_complete_condition(v) for v in value)
    return False


def _tjpipe(fleet: ComposeFleet, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI on the host with the hub's env file's three settings (hub.env, as a user sources it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "TJPIPE_"))}
    env.update(
        NATS_URL=f"tls://127.0.0.1:{fleet.hub_port}",
        NATS_TLS_CA=str(fleet.state / "hub-ca.crt"),
        NATS_CREDS=str(fleet.state / "fleet-reader.nk"),
    )
    hub_env = (fleet.state / "hub.env").read_text()
    assert f"export NATS_URL={env['NATS_URL']}\n" in hub_env, hub_env
    return subprocess.run(
        [sys.executable, "-m", "tjpipe", *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


async def _fleet_index(fleet: ComposeFleet) -> FleetIndex:
    index = FleetIndex(CLUSTERS)
    nc = await fleet.reader()
    try:
        await index.catch_up(nc.jetstream())
    finally:
        await nc.close()
    return index


async def _until_hub_holds_everything(fleet: ComposeFleet) -> dict[str, dict[str, int]]:
    deadline = time.monotonic() + HUB_WITHIN
    while True:
        problems, counts = await _copy_problems(fleet)
        if not problems:
            return counts
        if time.monotonic() > deadline:
            raise AssertionError(f"after {HUB_WITHIN:.0f}s: " + "; ".join(problems))
        await asyncio.sleep(2)


async def _copy_problems(fleet: ComposeFleet) -> tuple[list[str], dict[str, dict[str, int]]]:
    """Each member record stream against its fleet stream at the hub (``copy_problems``)."""
    hub = await fleet.reader()
    readers = {c: await m.reader() for c, m in fleet.members.items()}
    problems: list[str] = []
    counts: dict[str, dict[str, int]] = {}
    try:
        for origin in RECORD_STREAMS:
            copies = []
            for cluster in readers:  # each member's copies are in a fleet stream of its own
                name = fleet_contract.fleet_stream(origin, cluster)
                copies += await bus_history.read_stream(hub.jetstream(), name, f"{fleet_contract.PREFIX}.>")
            at_hub = origin_seqs(copies)
            held = {}
            for cluster, reader in readers.items():
                info = await reader.jetstream().stream_info(origin)
                held[cluster] = (int(info.state.first_seq or 0), int(info.state.last_seq or 0))
                counts.setdefault(origin, {})[cluster] = len(at_hub.get(cluster, []))
            problems += copy_problems(origin, at_hub, held)
    finally:
        for nc in (hub, *readers.values()):
            await nc.close()
    return problems, counts

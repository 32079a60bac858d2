"""A fleet on loopback: a hub of three nats-servers (one JetStream cluster, domain ``hub``) and member servers
joined to it as leaf nodes over TLS, each with its own JetStream domain, its own pipeline identities and the
bus a lone cluster has (``tjpipe.stack.setup_bus_as_admin``).

Every config file is what ``tjpipe.fleet`` renders; the harness only picks ports and folders. A member's link
is cut and healed the way an operator would: its remote is marked ``disabled`` in its config and the server
reloads it (SIGHUP), with no restart and no other change.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import nats
from nats.aio.client import Client as NATS

from contracts import fleet as fleet_contract
from contracts import streams, subjects
from plumbing import bus
from tjpipe import fleet
from tjpipe.credentials import Credentials, generate_credentials, server_authorization, write_self_signed_tls
from tjpipe.local.natsd import GO_RUNTIME_ENV, LocalNats, LocalNatsCluster, _Member, _start_member, nats_server_binary
from tjpipe.local.procs import free_port, http_ok, spawn, wait_until
from tjpipe.nats_server import get_json, reload_config
from tjpipe.private_files import write_private_file
from tjpipe.stack import setup_bus_as_admin

STARTUP_SECONDS = 30.0


def _ports(count: int) -> list[int]:
    out: list[int] = []
    while len(out) < count:
        port = free_port()
        if port not in out:
            out.append(port)
    return out


@dataclass
class Member:
    cluster: str
    server: LocalNats
    creds: Credentials
    config_path: Path
    client_port: int
    monitor_port: int
    store_dir: Path
    log_dir: Path
    hub_leaf_urls: list[str]
    leaf_seed: str
    ca_file: str
    linked: bool = True

    def config(self) -> str:
        return (
            f'server_name: "{self.cluster}"\n'
            f'listen: "127.0.0.1:{self.client_port}"\n'
            f'http: "127.0.0.1:{self.monitor_port}"\n'
            + fleet.member_config(
                cluster=self.cluster,
                store_dir=str(self.store_dir),
                hub_leaf_urls=self.hub_leaf_urls,
                leaf_seed=self.leaf_seed,
                ca_file=self.ca_file,
                enabled=self.linked,
            )
            + server_authorization(self.creds)
        )

    def leaf_count(self) -> int:
        return int(get_json(f"{self.server.monitor_url}/leafz").get("leafnodes") or 0)

    def set_link(self, up: bool, *, timeout: float = 20.0) -> None:
        """Cut (``up=False``) or heal the leaf link by config reload; returns once the server shows it."""
        self.linked = up
        fleet.write_member_config(self.config_path, self.config())
        reload_config(str(self.server.process.pid), monitor_url=self.server.monitor_url)
        wait_until(
            lambda: (self.leaf_count() > 0) == up,
            timeout=timeout,
            what=f"member {self.cluster}'s leaf link {'up' if up else 'down'}",
        )

    async def connect(self, identity: str) -> NATS:
        name = f"fleet-test-{self.cluster}-{identity}"
        return await bus.connect(self.server.url, name=name, creds=self.creds.seed_file(identity))


@dataclass
class Fleet:
    root: Path
    creds: fleet.FleetCredentials
    hub: LocalNatsCluster
    hub_members: list[_Member]
    leaf_ports: list[int]
    tls: dict[str, Path]
    members: dict[str, Member] = field(default_factory=dict)

    @property
    def hub_leaf_urls(self) -> list[str]:
        return [f"nats-leaf://127.0.0.1:{port}" for port in self.leaf_ports]

    async def hub_connect(self, identity: str = fleet.HUB_ADMIN, **options: object) -> NATS:
        return await nats.connect(
            servers=self.hub.url.split(","),
            name=f"fleet-test-hub-{identity}",
            nkeys_seed=str(self.creds.hub_seed(identity)),
            inbox_prefix=bus.identity_inbox_prefix(identity),
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            **options,  # type: ignore[arg-type]
        )

    def stop_hub(self) -> None:
        for server in self.hub.servers:
            server.stop(timeout=10)

    def start_hub(self) -> None:
        self.hub.servers = [_start_member(member, log_dir=self.root / "logs") for member in self.hub_members]
        self.hub.wait_ready(timeout=STARTUP_SECONDS)

    def stop(self) -> None:
        for member in self.members.values():
            member.server.stop()
        self.hub.stop()


def start_fleet(root: Path, clusters: Sequence[str]) -> Fleet:
    """The hub, then each member with its bus set up, then the hub's fleet streams sourcing them all."""
    log_dir = root / "logs"
    tls = write_self_signed_tls(root / "tls", ["127.0.0.1", "localhost"])
    creds = fleet.generate_fleet_credentials(root / "fleet-creds", clusters)
    authorization = fleet.hub_authorization(creds, list(clusters))
    ports = _ports(4 * 3)
    route_password = secrets.token_urlsafe(24)
    hub_tls = fleet.HubTls(cert_file=str(tls["tls.crt"]), key_file=str(tls["tls.key"]), ca_file=str(tls["ca.crt"]))
    members: list[_Member] = []
    for i in range(3):
        name = f"hub-{i}"
        store = root / name / "store"
        store.mkdir(parents=True, exist_ok=True)
        server = fleet.HubServer(
            name=name,
            client_listen=f"127.0.0.1:{ports[4 * i]}",
            monitor_listen=f"127.0.0.1:{ports[4 * i + 1]}",
            cluster_listen=f"127.0.0.1:{ports[4 * i + 2]}",
            leaf_listen=f"127.0.0.1:{ports[4 * i + 3]}",
            store_dir=str(store),
            routes=tuple(f"127.0.0.1:{ports[4 * j + 2]}" for j in range(3) if j != i),
        )
        config_path = root / name / "nats.conf"
        write_private_file(
            config_path,
            fleet.hub_config(server, tls=hub_tls, authorization=authorization, route_password=route_password).encode(),
        )
        members.append(
            _Member(
                name=name,
                client_port=ports[4 * i],
                monitor_port=ports[4 * i + 1],
                cluster_port=ports[4 * i + 2],
                store_dir=store,
                config_path=config_path,
            )
        )
    servers = [_start_member(member, log_dir=log_dir) for member in members]
    hub = LocalNatsCluster(servers=servers, log_dir=log_dir, _members=members)
    leaf_ports = [ports[4 * i + 3] for i in range(3)]
    out = Fleet(root=root, creds=creds, hub=hub, hub_members=members, leaf_ports=leaf_ports, tls=tls)
    try:
        hub.wait_ready(timeout=STARTUP_SECONDS)
        for cluster in clusters:
            out.members[cluster] = start_member(out, cluster)
        asyncio.run(_setup_hub(out, list(clusters)))
    except BaseException:
        out.stop()
        raise
    return out


def start_member(fleet_: Fleet, cluster: str) -> Member:
    folder = fleet_.root / cluster
    client_port, monitor_port = _ports(2)
    member = Member(
        cluster=cluster,
        server=None,  # type: ignore[arg-type]
        creds=generate_credentials(folder / "creds"),
        config_path=folder / "nats.conf",
        client_port=client_port,
        monitor_port=monitor_port,
        store_dir=folder / "store",
        log_dir=fleet_.root / "logs",
        hub_leaf_urls=fleet_.hub_leaf_urls,
        leaf_seed=fleet_.creds.leaf_seed(cluster).read_text(),
        ca_file=str(fleet_.tls["ca.crt"]),
    )
    member.store_dir.mkdir(parents=True, exist_ok=True)
    fleet.write_member_config(member.config_path, member.config())
    process = spawn(
        name=f"nats-{cluster}",
        argv=[str(nats_server_binary()), "-c", str(member.config_path)],
        log_dir=member.log_dir,
        env=GO_RUNTIME_ENV,
    )
    member.server = LocalNats(
        url=f"nats://127.0.0.1:{client_port}",
        monitor_url=f"http://127.0.0.1:{monitor_port}",
        process=process,
        store_dir=member.store_dir,
    )
    try:
        wait_until(
            lambda: http_ok(f"{member.server.monitor_url}/healthz?js-enabled-only=true", timeout=1),
            timeout=STARTUP_SECONDS,
            what=f"member {cluster}'s JetStream",
            process=process,
        )
        setup_bus_as_admin(member.server.url, member.creds, environ={}, tls_from_env=False)
        wait_until(lambda: member.leaf_count() > 0, timeout=STARTUP_SECONDS, what=f"member {cluster}'s leaf link")
    except BaseException:
        process.stop()
        raise
    return member


async def _setup_hub(fleet_: Fleet, clusters: list[str]) -> None:
    nc = await fleet_.hub_connect()
    try:
        await fleet.setup_fleet_streams(nc.jetstream(), clusters)
        await fleet.wait_caught_up(nc.jetstream(), timeout=60)
    finally:
        await nc.close()


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
        durable = bus.partition_consumer(spec, partition).durable
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

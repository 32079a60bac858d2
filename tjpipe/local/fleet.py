"""A fleet on loopback, for tests and benchmarks: a hub of three nats-servers (one JetStream cluster, domain
``hub``) and member servers joined to it as leaf nodes over mutual TLS, each with its own JetStream domain, its own
pipeline identities and the bus a lone cluster has (``tjpipe.local.stack.setup_bus_as_admin``).

Every config file is what ``tjpipe.fleet_nats`` renders; the harness only picks ports and folders. A member's link
is cut and healed the way an operator would: its remote is marked ``disabled`` in its config and the server
reloads it (SIGHUP), with no restart and no other change.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import secrets
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NATS

from contracts import streams
from plumbing import bus, bus_setup
from tjpipe import fleet_nats
from tjpipe.credentials import Credentials, generate_credentials, server_authorization
from tjpipe.local.natsd import GO_RUNTIME_ENV, LocalNats, LocalNatsCluster, _Member, _start_member, nats_server_binary
from tjpipe.local.procs import ManagedProcess, free_port, http_ok, spawn, wait_until
from tjpipe.nats_server import get_json, reload_config
from tjpipe.private_files import write_private_file

STARTUP_SECONDS = 30.0
HUB_FILE_STORE = "1TB"
"""The local hub servers' JetStream disk limit: the server's own ceiling, so that whether the fleet streams are
placed does not depend on how full this machine's disk is (the streams' byte limits are reserved, not used)."""


def _ports(count: int) -> list[int]:
    out: list[int] = []
    while len(out) < count:
        port = free_port()
        if port not in out:
            out.append(port)
    return out


@dataclass
class LocalMember:
    """One member cluster's nats-server: its domain is its name, its identities a lone cluster's."""

    cluster: str
    creds: Credentials
    config_path: Path
    client_port: int
    monitor_port: int
    store_dir: Path
    log_dir: Path
    hub_leaf_urls: list[str]
    leaf_seed: str
    ca_file: str
    client_cert: tuple[str, str]
    linked: bool = True
    process: ManagedProcess | None = None

    @property
    def server(self) -> LocalNats:
        if self.process is None:
            raise RuntimeError(f"member {self.cluster}'s server is not started")
        return LocalNats(
            url=f"nats://127.0.0.1:{self.client_port}",
            monitor_url=f"http://127.0.0.1:{self.monitor_port}",
            process=self.process,
            store_dir=self.store_dir,
        )

    def config(self) -> str:
        return (
            f'server_name: "{self.cluster}"\n'
            f'listen: "127.0.0.1:{self.client_port}"\n'
            f'http: "127.0.0.1:{self.monitor_port}"\n'
            + fleet_nats.member_config(
                cluster=self.cluster,
                store_dir=str(self.store_dir),
                hub_leaf_urls=self.hub_leaf_urls,
                leaf_seed=self.leaf_seed,
                ca_file=self.ca_file,
                enabled=self.linked,
                client_cert=self.client_cert,
            )
            + server_authorization(self.creds)
        )

    def leaf_count(self) -> int:
        return int(get_json(f"{self.server.monitor_url}/leafz").get("leafnodes") or 0)

    def set_link(self, up: bool, *, timeout: float = 20.0) -> None:
        """Cut (``up=False``) or heal the leaf link by config reload; returns once the server shows it."""
        self.linked = up
        fleet_nats.write_member_config(self.config_path, self.config())
        reload_config(str(self.server.process.pid), monitor_url=self.server.monitor_url)
        wait_until(
            lambda: (self.leaf_count() > 0) == up,
            timeout=timeout,
            what=f"member {self.cluster}'s leaf link {'up' if up else 'down'}",
        )

    async def connect(self, identity: str) -> NATS:
        name = f"fleet-{self.cluster}-{identity}"
        return await bus.connect(self.server.url, name=name, creds=self.creds.seed_file(identity))


@dataclass
class LocalFleet:
    """The hub's three servers and the members, by cluster name."""

    root: Path
    creds: fleet_nats.FleetCredentials
    hub: LocalNatsCluster
    hub_members: list[_Member]
    leaf_ports: list[int]
    tls: dict[str, Path]
    members: dict[str, LocalMember] = field(default_factory=dict)

    @property
    def hub_leaf_urls(self) -> list[str]:
        return [f"nats-leaf://127.0.0.1:{port}" for port in self.leaf_ports]

    async def hub_connect(self, identity: str = fleet_nats.HUB_ADMIN) -> NATS:
        """A connection to the hub as one of its identities (``fleet-admin``, ``fleet-reader``)."""
        return await nats.connect(
            servers=self.hub.url.split(","),
            name=f"fleet-hub-{identity}",
            nkeys_seed=str(self.creds.hub_seed(identity)),
            inbox_prefix=bus.identity_inbox_prefix(identity),
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
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


def start_fleet(root: Path, clusters: Sequence[str]) -> LocalFleet:
    """The hub, then each member with its bus set up, then the hub's fleet streams sourcing them all."""
    log_dir = root / "logs"
    tls = fleet_nats.write_fleet_tls(root / "tls", ["127.0.0.1", "localhost"], clusters)
    creds = fleet_nats.generate_fleet_credentials(root / "fleet-creds", clusters)
    authorization = fleet_nats.hub_authorization(creds, list(clusters))
    ports = _ports(4 * 3)
    route_password = secrets.token_urlsafe(24)
    hub_tls = fleet_nats.HubTls(
        cert_file=str(tls["hub.crt"]), key_file=str(tls["hub.key"]), ca_file=str(tls["ca.crt"]), verify_clients=True
    )
    members: list[_Member] = []
    for i in range(3):
        name = f"hub-{i}"
        store = root / name / "store"
        store.mkdir(parents=True, exist_ok=True)
        server = fleet_nats.HubServer(
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
            fleet_nats.hub_config(
                server,
                tls=hub_tls,
                authorization=authorization,
                route_password=route_password,
                max_file_store=HUB_FILE_STORE,
            ).encode(),
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
    out = LocalFleet(root=root, creds=creds, hub=hub, hub_members=members, leaf_ports=leaf_ports, tls=tls)
    try:
        hub.wait_ready(timeout=STARTUP_SECONDS)
        for cluster in clusters:
            out.members[cluster] = start_member(out, cluster)
        _in_thread(_setup_hub(out, list(clusters)))
    except BaseException:
        out.stop()
        raise
    return out


def start_member(fleet_: LocalFleet, cluster: str) -> LocalMember:
    """Member ``cluster``'s server joined to the hub, with its bus set up as a lone cluster's."""
    folder = fleet_.root / cluster
    client_port, monitor_port = _ports(2)
    member = LocalMember(
        cluster=cluster,
        creds=generate_credentials(folder / "creds"),
        config_path=folder / "nats.conf",
        client_port=client_port,
        monitor_port=monitor_port,
        store_dir=folder / "store",
        log_dir=fleet_.root / "logs",
        hub_leaf_urls=fleet_.hub_leaf_urls,
        leaf_seed=fleet_.creds.leaf_seed(cluster).read_text(),
        ca_file=str(fleet_.tls["ca.crt"]),
        client_cert=(str(fleet_.tls[f"{cluster}.crt"]), str(fleet_.tls[f"{cluster}.key"])),
    )
    member.store_dir.mkdir(parents=True, exist_ok=True)
    fleet_nats.write_member_config(member.config_path, member.config())
    process = spawn(
        name=f"nats-{cluster}",
        argv=[str(nats_server_binary()), "-c", str(member.config_path)],
        log_dir=member.log_dir,
        env=GO_RUNTIME_ENV,
    )
    member.process = process
    try:
        wait_until(
            lambda: http_ok(f"{member.server.monitor_url}/healthz?js-enabled-only=true", timeout=1),
            timeout=STARTUP_SECONDS,
            what=f"member {cluster}'s JetStream",
            process=process,
        )
        _in_thread(_setup_member_bus(member))
        wait_until(lambda: member.leaf_count() > 0, timeout=STARTUP_SECONDS, what=f"member {cluster}'s leaf link")
    except BaseException:
        process.stop()
        raise
    return member


async def _setup_hub(fleet_: LocalFleet, clusters: list[str]) -> None:
    nc = await fleet_.hub_connect()
    try:
        await fleet_nats.setup_fleet_streams(nc.jetstream(), clusters)
        await fleet_nats.wait_caught_up(nc.jetstream(), timeout=60)
    finally:
        await nc.close()


async def _setup_member_bus(member: LocalMember) -> None:
    """The member's bus exactly as a lone cluster's set-up makes it (``plumbing.bus_setup.setup_bus``, admin)."""
    nc = await bus.connect(
        member.server.url, name=f"fleet-{member.cluster}-setup", creds=member.creds.seed_file("admin")
    )
    try:
        await bus_setup.setup_bus(nc.jetstream(), streams.configured_streams())
    finally:
        await nc.close()


def _in_thread(step: Coroutine[Any, Any, None]) -> None:
    """Run ``step`` on an event loop of its own, so that a caller inside an event loop can start a fleet too."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, step).result()

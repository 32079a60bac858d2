"""A fleet on NATS: a hub that holds every member cluster's history, and members that never depend on it.

Why leaf nodes and JetStream domains: a member's nats-server joins the hub as a leaf node, and each side
keeps its own JetStream under its own domain. A client of the member that asks ``$JS.API`` is answered by
the member's JetStream whether the hub is there or not, so the member's watcher, planner and applier plan
and apply exactly as a lone cluster does, link or no link; the link only ever carries copies of records.

Why the hub pulls (stream sources) rather than the member pushes: a member's fleet stream at the hub has
the member's record stream as its source, in the member's domain (``external.api = $JS.<cluster>.API``). The
hub's stream leader asks the member's JetStream for a consumer starting after the last record it holds
from that member, so a member that was away is caught up from where it left off, and the hub drops
anything at or below that position: nothing lost (within the member's own retention), nothing twice. The
member's streams, subjects and identities stay exactly as a lone cluster has them.

Why a subject transform per source: it stores each record as ``fleet.<cluster>.<its subject>``
(``contracts.fleet``). The name comes from the hub's own configuration of the source, not from anything the
member sends, so a member cannot put its records under another cluster's name.

Why the member's leaf identity is a user with permissions in the hub's account, and not an entry in the
leaf listener's ``authorization`` block: entries there carry no permissions. As a user of the account,
restricted to leaf connections, it may, from the member's side of the link:

- send into the hub only the copies the hub asked it for (``fleet-deliver.<cluster>.>``) and the answers
  of its JetStream API (``$JSC.R.<cluster>.>``, a per-domain reply space the hub's ``js_api_reply_v2``
  feature flag gives): nothing onto the hub's work subjects, no request to the hub's or another member's
  JetStream API;
- receive from the hub only the consumer-create requests for its record streams and the flow-control
  replies to its own consumers (``$JS.FC.<cluster>.…``, a per-domain form the member's ``js_ack_fc_v2``
  feature flag gives): nothing of its work streams' subjects, no other API call, nothing of another member.

The member adds ``deny_imports`` of its own work subjects on its side of the link; the hub's permissions
are the boundary, the member's list is its own second wall.

The hub is a JetStream cluster of three servers with one domain; every server listens for leaf nodes over
TLS (a leaf may land on any of them), and every member lists them all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import nats.errors
from nats.js import JetStreamContext
from nats.js import api as js_api

from contracts import fleet, subjects
from plumbing.bus import identity_inbox_prefix, inbox_prefix
from plumbing.bus_setup import put_stream, until_done
from tjpipe.credentials import new_user_seed, public_key_of
from tjpipe.private_files import write_private_file

HUB_ADMIN = "fleet-admin"
"""Sets up the hub's fleet streams; like a member's ``admin``, mounted into no service."""
HUB_READER = "fleet-reader"
"""Reads the fleet streams (the fleet's history server), with direct gets only."""
HUB_IDENTITIES = (HUB_ADMIN, HUB_READER)
LEAF_PREFIX = "leaf-"
"""A member's leaf identity is ``leaf-<cluster>``."""

DUPLICATE_WINDOW_SECONDS = 0.1
"""A fleet stream's window for ``Nats-Msg-Id`` duplicates: the shortest the server takes (100 ms).

Sourcing already stores each origin record once (by the origin's sequence); a longer window would only drop
a member's record whose id repeats one of its own a little earlier. Each member's copies are in streams of
their own, so no member's ids can make another's records look like duplicates."""


@dataclass(frozen=True)
class LeafPermissions:
    """What a member's leaf connection may carry, from the member's side: ``publish`` is member → hub,
    ``subscribe`` is hub → member (the server applies a leaf user's permissions that way round)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


def leaf_identity(cluster: str) -> str:
    return f"{LEAF_PREFIX}{fleet.check_cluster_name(cluster)}"


def leaf_permissions(cluster: str) -> LeafPermissions:
    """The member ``cluster``'s leaf user: export its records when the hub asks, and nothing else."""
    fleet.check_cluster_name(cluster)
    api = fleet.api_prefix(cluster)
    subscribe: list[str] = []
    for spec in fleet.FLEET_STREAMS:
        subscribe += [
            f"{api}.CONSUMER.CREATE.{spec.origin}",
            f"{api}.CONSUMER.CREATE.{spec.origin}.>",
            flow_control_subjects(cluster, spec.origin),
        ]
    return LeafPermissions(
        publish=(f"$JSC.R.{cluster}.>", f"{fleet.DELIVER_PREFIX}.{cluster}.>"),
        subscribe=tuple(subscribe),
    )


def flow_control_subjects(cluster: str, origin: str) -> str:
    """The flow-control replies the hub sends the consumer it reads ``cluster``'s stream ``origin`` with.

    A member's server names its JetStream domain (the cluster's name) in them, ``$JS.FC.<domain>.<account
    hash>.<stream>.<consumer>.<id>``, because ``member_config`` turns on the server's second subject form
    for acknowledgements and flow control (``js_ack_fc_v2``). In the first form, ``$JS.FC.<stream>.…``, the
    subjects of every member's consumers on the same stream look alike, so each member's leaf user could
    receive every other member's flow control."""
    return f"$JS.FC.{fleet.check_cluster_name(cluster)}.*.{origin}.>"


def reader_permissions(members: Sequence[str]) -> tuple[str, ...]:
    """The hub reader's publish allow-list: the fleet streams' names, and stream info and direct gets on each
    member's fleet streams only."""
    out = ["$JS.API.STREAM.NAMES"]
    for spec in fleet.FLEET_STREAMS:
        for cluster in members:
            name = fleet.fleet_stream(spec.origin, cluster)
            out += [f"$JS.API.STREAM.INFO.{name}", f"$JS.API.DIRECT.GET.{name}", f"$JS.API.DIRECT.GET.{name}.>"]
    return tuple(out)


# ----------------------------------------------------------------------------------------- credentials


@dataclass(frozen=True)
class FleetCredentials:
    """The hub's seeds: ``<root>/hub/<identity>.nk`` for its own identities, ``<root>/members/<cluster>.nk``
    for each member's leaf identity (that seed goes to the member, into its leaf remote)."""

    root: Path

    def hub_seed(self, identity: str) -> Path:
        if identity not in HUB_IDENTITIES:
            raise ValueError(f"unknown hub identity {identity!r}; one of {', '.join(HUB_IDENTITIES)}")
        return self.root / "hub" / f"{identity}.nk"

    def leaf_seed(self, cluster: str) -> Path:
        return self.root / "members" / f"{fleet.check_cluster_name(cluster)}.nk"

    def members(self) -> list[str]:
        folder = self.root / "members"
        return sorted(path.stem for path in folder.glob("*.nk")) if folder.is_dir() else []

    def public_key(self, seed_file: Path) -> str:
        return public_key_of(seed_file.read_bytes())


def generate_fleet_credentials(root: Path, members: Iterable[str] = ()) -> FleetCredentials:
    """Seeds for the hub's identities and for each of ``members`` that has none yet (mode 0600, folders 0700)."""
    creds = FleetCredentials(root)
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    paths = [creds.hub_seed(identity) for identity in HUB_IDENTITIES]
    paths += [creds.leaf_seed(cluster) for cluster in members]
    for path in paths:
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_private_file(path, new_user_seed() + b"\n")
    return creds


def write_fleet_tls(
    root: Path, hub_hosts: Iterable[str], members: Iterable[str], *, days: int = 825
) -> dict[str, Path]:
    """A private CA, the hub's leaf listener certificate for ``hub_hosts``, and a client certificate per member.

    For where cert-manager is not used. Files: ``ca.crt``, ``hub.crt``/``hub.key``, and
    ``members/<cluster>.crt``/``.key`` (common name ``leaf-<cluster>``); keys mode 0600. The CA's key is not
    kept: a new member means new certificates all round (or a CA kept elsewhere).
    """
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from tjpipe.keys.pki import private_key_pem, self_signed_ca, serving_certificate

    def names_of(hosts: Iterable[str]) -> list[x509.GeneralName]:
        out: list[x509.GeneralName] = []
        for host in hosts:
            try:
                out.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                out.append(x509.DNSName(host))
        return out

    now = dt.datetime.now(dt.UTC)
    start, end = now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)
    ca_key, ca = self_signed_ca("trainjob-pipeline fleet CA", not_before=start, not_after=end)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    paths = {"ca.crt": root / "ca.crt", "hub.crt": root / "hub.crt", "hub.key": root / "hub.key"}
    paths["ca.crt"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    key, cert = serving_certificate(
        ca_key, ca, common_name="fleet-hub", names=names_of(hub_hosts), not_before=start, not_after=end
    )
    paths["hub.crt"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    write_private_file(paths["hub.key"], private_key_pem(key))
    (root / "members").mkdir(exist_ok=True, mode=0o700)
    for cluster in members:
        identity = leaf_identity(cluster)
        key, cert = serving_certificate(
            ca_key,
            ca,
            common_name=identity,
            names=[x509.DNSName(identity)],
            not_before=start,
            not_after=end,
            client_auth=True,
        )
        paths[f"{cluster}.crt"] = root / "members" / f"{cluster}.crt"
        paths[f"{cluster}.key"] = root / "members" / f"{cluster}.key"
        paths[f"{cluster}.crt"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        write_private_file(paths[f"{cluster}.key"], private_key_pem(key))
    return paths


# ---------------------------------------------------------------------------------------------- configs


def _q(value: str) -> str:
    """A quoted string of the NATS config format (JSON's are): a ``$`` or a space stays literal."""
    return json.dumps(value)


def _list(values: Iterable[str]) -> str:
    return "[" + ", ".join(_q(v) for v in values) + "]"


def hub_authorization(creds: FleetCredentials, members: Sequence[str]) -> str:
    """The hub's ``authorization`` block: its admin and reader, and one leaf-only user per member."""
    reader_key = creds.public_key(creds.hub_seed(HUB_READER))
    # The reader's replies come to its identity's inbox or its key's (plumbing.bus.connect), as a member's.
    inboxes = [f"{identity_inbox_prefix(HUB_READER)}.>", f"{inbox_prefix(reader_key)}.>"]
    lines = ["authorization {", "  users = ["]
    lines.append(f"    {{nkey: {_q(creds.public_key(creds.hub_seed(HUB_ADMIN)))}}}  # {HUB_ADMIN}")
    lines.append(
        f"    {{nkey: {_q(reader_key)}, permissions: {{"
        f"publish: {{allow: {_list(reader_permissions(members))}}}, subscribe: {{allow: {_list(inboxes)}}}}}}}"
        f"  # {HUB_READER}"
    )
    for cluster in members:
        rules = leaf_permissions(cluster)
        lines.append(
            f"    {{nkey: {_q(creds.public_key(creds.leaf_seed(cluster)))}, "
            'allowed_connection_types: ["LEAFNODE"], permissions: {'
            f"publish: {{allow: {_list(rules.publish)}}}, subscribe: {{allow: {_list(rules.subscribe)}}}}}}}"
            f"  # {leaf_identity(cluster)}"
        )
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class HubServer:
    """One server of the hub's JetStream cluster: where it listens and keeps its store."""

    name: str
    client_listen: str
    monitor_listen: str
    cluster_listen: str
    leaf_listen: str
    store_dir: str
    routes: tuple[str, ...] = field(default=())
    """The other servers' cluster addresses, ``host:port``."""


@dataclass(frozen=True)
class HubTls:
    """The hub's leaf listener certificate (PEM files), and the CA the members check it with.

    With ``verify_clients`` the hub also asks every member for a client certificate signed by that CA
    (mutual TLS): a stolen leaf seed alone then does not get a connection.
    """

    cert_file: str
    key_file: str
    ca_file: str
    verify_clients: bool = False


def hub_config(
    server: HubServer,
    *,
    tls: HubTls,
    authorization: str,
    route_password: str,
    cluster_name: str = "fleet-hub",
    domain: str = fleet.HUB_DOMAIN,
    client_tls: HubTls | None = None,
    max_file_store: str | None = None,
) -> str:
    """One hub server's whole nats.conf: JetStream in the hub's domain, routes, the leaf listener over TLS.

    ``max_file_store`` bounds the hub's JetStream on disk (``8GB``). Without it the server takes what the disk
    has free when it starts, and refuses to place a fleet stream once the streams' byte limits, each member's
    counted on every replica, add up to more: the same hub would place them on an emptier disk.

    ``client_tls`` serves the client port (the fleet's set-up and history reader) over TLS too; they log in
    with their nkeys either way, so it asks them for no certificate.
    """
    routes = "\n".join(f"    {_q(f'nats-route://route:{route_password}@{host}')}" for host in server.routes)
    clients = (
        f"tls {{\n  cert_file: {_q(client_tls.cert_file)}\n  key_file: {_q(client_tls.key_file)}\n"
        f"  ca_file: {_q(client_tls.ca_file)}\n  timeout: 5\n}}\n"
        if client_tls
        else ""
    )
    return (
        f"server_name: {_q(server.name)}\n"
        f"listen: {_q(server.client_listen)}\n"
        f"http: {_q(server.monitor_listen)}\n" + clients +
        # Replies of a member's JetStream API come back under $JSC.R.<domain>., so each member's leaf user may
        # answer only in its own domain's reply space.
        # js_snapshot_sources: a replica that caught up from a snapshot keeps the sources' positions, so on
        # becoming leader it does not copy again what the fleet stream already holds (every hub server runs
        # the same 2.15 binary, which the flag requires).
        "feature_flags { js_api_reply_v2: true, js_snapshot_sources: true }\n"
        f"jetstream {{\n  store_dir: {_q(server.store_dir)}\n  domain: {_q(domain)}\n"
        + _store_limits(max_file_store=max_file_store)
        + "}\n"
        "cluster {\n"
        f"  name: {_q(cluster_name)}\n"
        f"  listen: {_q(server.cluster_listen)}\n"
        f'  authorization {{\n    user: "route"\n    password: {_q(route_password)}\n  }}\n'
        f"  routes: [\n{routes}\n  ]\n"
        "}\n"
        "leafnodes {\n"
        f"  listen: {_q(server.leaf_listen)}\n"
        # One member's interest is not passed on to the others: a member hears nothing of another.
        "  isolate_leafnode_interest: true\n"
        f"  tls {{\n    cert_file: {_q(tls.cert_file)}\n    key_file: {_q(tls.key_file)}\n"
        f"    ca_file: {_q(tls.ca_file)}\n    timeout: 5\n"
        + ("    verify: true\n" if tls.verify_clients else "")
        + "  }\n"
        "}\n" + authorization
    )


_STORE_SIZE = re.compile(r"[1-9][0-9]*([KMGT]B?)?", re.IGNORECASE)


def check_store_size(value: str) -> str:
    """A JetStream size as the server reads it (``8GB``, ``512M``, bytes), written bare: quoted, it is refused."""
    if not _STORE_SIZE.fullmatch(value):
        raise ValueError(f"{value!r} is not a size: a whole number, optionally with K, M, G or T (8GB, 512M)")
    return value


def _store_limits(*, max_memory_store: str | None = None, max_file_store: str | None = None) -> str:
    """The lines of a ``jetstream`` block that bound its stores, for those given."""
    return "".join(
        f"  {key}: {check_store_size(value)}\n"
        for key, value in (("max_memory_store", max_memory_store), ("max_file_store", max_file_store))
        if value
    )


def member_config(
    *,
    cluster: str,
    store_dir: str,
    hub_leaf_urls: Sequence[str],
    leaf_seed: str,
    ca_file: str,
    enabled: bool = True,
    reconnect_seconds: float = 1.0,
    client_cert: tuple[str, str] | None = None,
    max_memory_store: str | None = None,
    max_file_store: str | None = None,
) -> str:
    """What a member's nats.conf adds for the fleet: its JetStream domain and its leaf remote to the hub.

    ``leaf_seed`` is the member's leaf nkey seed (``FleetCredentials.leaf_seed``), so the file holding this
    must be as private as a seed (mode 0600, a Secret). ``client_cert`` (certificate and key files) is the
    member's certificate for a hub that verifies its members (``HubTls.verify_clients``). ``enabled=False``
    keeps the remote configured but not connected: a reload with it cuts the link, and a reload without it
    heals it. ``max_memory_store`` and ``max_file_store`` (sizes as the server reads them, ``8GB``) bound the
    member's JetStream: this is its whole ``jetstream`` block, which a second one in the same file would
    replace, not extend.
    """
    fleet.check_cluster_name(cluster)
    urls = _list(url if "://" in url else f"nats-leaf://{url}" for url in hub_leaf_urls)
    work = (f"{subjects.EVENTS_PREFIX}.>", f"{subjects.APPLY_PREFIX}.>", "$KV.>", "$JS.API.>")
    limits = _store_limits(max_memory_store=max_memory_store, max_file_store=max_file_store)
    return (
        f"jetstream {{\n  store_dir: {_q(store_dir)}\n  domain: {_q(cluster)}\n{limits}}}\n"
        # Acknowledgement and flow-control subjects that name this member's domain, so that the hub's leaf
        # permissions can give each member its own flow control only (``leaf_permissions``).
        "feature_flags { js_ack_fc_v2: true }\n"
        "leafnodes {\n"
        f"  reconnect: {_q(f'{reconnect_seconds:g}s')}\n"
        "  remotes: [\n"
        "    {\n"
        f"      urls: {urls}\n"
        f"      nkey: {_q(leaf_seed.strip())}\n"
        f"      tls {{\n        ca_file: {_q(ca_file)}\n        timeout: 5\n"
        + (f"        cert_file: {_q(client_cert[0])}\n        key_file: {_q(client_cert[1])}\n" if client_cert else "")
        + "      }\n"
        # The member's own wall: nothing of its work subjects comes in from the hub, whatever the hub allows.
        f"      deny_imports: {_list(work)}\n" + ("" if enabled else "      disabled: true\n") + "    }\n  ]\n}\n"
    )


# ------------------------------------------------------------------------------------------ fleet streams


def fleet_stream_config(spec: fleet.FleetStreamSpec, cluster: str, *, replicas: int = 3) -> js_api.StreamConfig:
    """Member ``cluster``'s stream of kind ``spec`` at the hub: no subjects of its own, that member's record
    stream as its one source with the cluster's name in every subject, and the member's quota as its limit."""
    src, dest = fleet.transform(fleet.check_cluster_name(cluster), spec)
    source = js_api.StreamSource(
        name=spec.origin,
        external=js_api.ExternalStream(api=fleet.api_prefix(cluster), deliver=fleet.deliver_subject(cluster, spec)),
        subject_transforms=[js_api.SubjectTransform(src=src, dest=dest)],
    )
    return js_api.StreamConfig(
        name=fleet.fleet_stream(spec.origin, cluster),
        description=spec.description,
        subjects=[],
        sources=[source],
        retention=js_api.RetentionPolicy.LIMITS,
        storage=js_api.StorageType.FILE,
        max_age=spec.max_age_seconds,
        max_bytes=spec.member_max_bytes if spec.member_max_bytes > 0 else -1,
        max_msgs_per_subject=spec.max_msgs_per_subject,
        discard=js_api.DiscardPolicy.OLD,
        duplicate_window=DUPLICATE_WINDOW_SECONDS,
        num_replicas=replicas,
        allow_direct=True,
    )


async def setup_fleet_streams(js: JetStreamContext, members: Sequence[str], *, replicas: int = 3) -> None:
    """Create or update each member's fleet streams (hub admin identity; idempotent).

    A member added later is its own streams: the others' are not touched. A source's identity at the server
    is its origin stream, API prefix and transform, so renaming a member copies its history again.
    """
    for spec in fleet.FLEET_STREAMS:
        for cluster in members:
            config = fleet_stream_config(spec, cluster, replicas=replicas)
            await until_done(functools.partial(put_stream, js, config), what=f"setting up fleet stream {config.name}")


async def fleet_streams(js: JetStreamContext, *, timeout: float = 5.0) -> list[tuple[fleet.FleetStreamSpec, str]]:
    """``(kind, cluster)`` of every member's fleet stream at the hub, by the streams' names."""
    nc = js._nc
    names: list[str] = []
    while True:
        reply = await nc.request("$JS.API.STREAM.NAMES", json.dumps({"offset": len(names)}).encode(), timeout=timeout)
        page = json.loads(reply.data)
        if "error" in page:
            raise RuntimeError(f"listing the hub's streams: {page['error'].get('description', page['error'])}")
        names += page.get("streams") or []
        if not page.get("streams") or len(names) >= int(page.get("total") or 0):
            break
    found = [fleet.stream_of(name) for name in names]
    order = {spec.name: i for i, spec in enumerate(fleet.FLEET_STREAMS)}
    return sorted((f for f in found if f is not None), key=lambda f: (order[f[0].name], f[1]))


@dataclass(frozen=True)
class SourceState:
    """How far the hub's copy of one member's record stream is."""

    stream: str
    cluster: str
    lag: int
    active_seconds: float | None
    """Seconds since the member last sent anything for it; None while it is not connected."""
    error: str


async def source_states(js: JetStreamContext, *, timeout: float = 5.0) -> list[SourceState]:
    """Every member's fleet stream's source as the hub sees it (lag in records, last activity, error).

    ``stream`` is the kind (``FLEET_RESULTS``), ``cluster`` the member, as the stream's name says.
    """
    nc = js._nc
    out: list[SourceState] = []
    for spec, cluster in await fleet_streams(js, timeout=timeout):
        reply = await nc.request(
            f"$JS.API.STREAM.INFO.{fleet.fleet_stream(spec.origin, cluster)}", b"", timeout=timeout
        )
        info = json.loads(reply.data)
        if "error" in info:
            continue
        for state in info.get("sources") or []:
            active = state.get("active")
            error = state.get("error") or {}
            out.append(
                SourceState(
                    stream=spec.name,
                    cluster=cluster,
                    lag=int(state.get("lag") or 0),
                    active_seconds=None if active is None or active < 0 else active / 1e9,
                    error=str(error.get("description", "")) if error else "",
                )
            )
    return out


async def wait_caught_up(js: JetStreamContext, *, timeout: float = 60.0) -> list[SourceState]:
    """Until every source of every fleet stream is connected with no lag; the states at the end.

    A stream whose info does not answer in time (its leader being elected again, after a hub server went) is
    not caught up yet: asked again, within the same ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            states = await source_states(js)
            seen: object = states
        except nats.errors.TimeoutError:
            states, seen = [], "a fleet stream's info did not answer"
        if states and all(s.lag == 0 and s.active_seconds is not None and not s.error for s in states):
            return states
        if loop.time() > deadline:
            raise TimeoutError(f"the fleet streams did not catch up within {timeout:.0f}s: {seen}")
        await asyncio.sleep(0.25)


def write_member_config(path: Path, text: str) -> Path:
    """A member's fleet config holds its leaf seed: written with mode 0600."""
    write_private_file(path, text.encode())
    return path


# ------------------------------------------------------------------------------------------------- gaps


GAP_RANGES_KEPT = 5
"""How many of a source's missing ranges are kept to show (the count covers them all)."""


@dataclass(frozen=True)
class SourceGap:
    """Records of one member's stream that the hub's copy never got."""

    stream: str
    cluster: str
    missing: int
    """Origin sequences skipped between two copies the hub holds, less what the hub itself removed there."""
    ranges: tuple[tuple[int, int], ...] = ()
    """The first ranges of origin sequences with records missing, ``(first, last)``, oldest first (where the
    hub removed copies too, a range may also hold records it did get)."""


@dataclass
class _SourceTrack:
    hub_seq: int
    origin_seq: int
    missing: int = 0
    ranges: list[tuple[int, int]] = field(default_factory=list)


class GapTracker:
    """Counts, per fleet stream and member, the member's records the hub's copy skipped (pure; no I/O).

    Why from the copies themselves: a source's lag is what the member still holds and the hub has not
    copied, so a record the member's retention dropped while its link was cut is in no lag: after the
    catch-up the lag is 0. But every copy keeps its origin sequence (``Nats-Stream-Source``), and a source
    copies in origin order, so two consecutive copies of one member whose origin sequences jump by more than
    one mean the records between were never copied: unless the hub itself removed copies stored between
    the two (a subject's message limit, a deletion), which ``fold`` is told as the hub's deleted sequences,
    and subtracts, so a gap is never over-reported. Before a member's first copy nothing is counted: the hub
    cannot tell records it never got from copies that aged out, or from the history a member had before it
    joined.
    """

    def __init__(self) -> None:
        self.next_seq: dict[str, int] = {}
        """Per fleet stream, the hub sequence to read from next."""
        self._sources: dict[tuple[str, str], _SourceTrack] = {}

    def fold(self, stream: str, hub_seq: int, cluster: str, origin_seq: int, deleted: Sequence[int]) -> None:
        """One copy, read in the hub's order; ``deleted`` is the fleet stream's removed sequences, sorted."""
        import bisect

        self.next_seq[stream] = max(self.next_seq.get(stream, 1), hub_seq + 1)
        track = self._sources.get((stream, cluster))
        if track is None:
            self._sources[(stream, cluster)] = _SourceTrack(hub_seq, origin_seq)
            return
        skipped = origin_seq - track.origin_seq - 1
        if skipped > 0:
            removed_here = bisect.bisect_left(deleted, hub_seq) - bisect.bisect_right(deleted, track.hub_seq)
            lost = skipped - removed_here
            if lost > 0:
                track.missing += lost
                if len(track.ranges) < GAP_RANGES_KEPT:
                    track.ranges.append((track.origin_seq + 1, origin_seq - 1))
        # A smaller origin sequence is a member whose stream started again (its store wiped): counted from
        # there on, with nothing lost.
        track.hub_seq, track.origin_seq = hub_seq, origin_seq

    def gaps(self) -> list[SourceGap]:
        return [
            SourceGap(stream=stream, cluster=cluster, missing=track.missing, ranges=tuple(track.ranges))
            for (stream, cluster), track in sorted(self._sources.items())
        ]


async def source_gaps(
    js: JetStreamContext, tracker: GapTracker | None = None, *, timeout: float = 5.0, page: int = 2048
) -> list[SourceGap]:
    """Every member's records that its fleet streams skipped, read from the copies (``GapTracker``); each
    gap's ``stream`` is the kind (``FLEET_RESULTS``).

    With the same ``tracker`` each call reads only the copies stored since the last (what a monitor does);
    without, it reads every fleet stream from its start. Needs stream info and direct gets of the fleet
    streams only (the ``fleet-reader`` identity)."""
    from plumbing.bus_history import read_stream

    tracker = tracker if tracker is not None else GapTracker()
    nc = js._nc
    for spec, cluster in await fleet_streams(js, timeout=timeout):
        name = fleet.fleet_stream(spec.origin, cluster)
        reply = await nc.request(
            f"$JS.API.STREAM.INFO.{name}", json.dumps({"deleted_details": True}).encode(), timeout=timeout
        )
        info = json.loads(reply.data)
        if "error" in info:
            continue
        deleted = sorted(int(seq) for seq in (info.get("state") or {}).get("deleted") or [])
        while True:
            start = tracker.next_seq.get(name, 1)
            copies = await read_stream(js, name, fleet.fleet_subject(cluster, ">"), start_seq=start, limit=page)
            for copy in copies:
                tracker.fold(name, copy.seq, cluster, copy.origin_seq, deleted)
            if len(copies) < page:
                break
    out = []
    for gap in tracker.gaps():
        kind = fleet.stream_of(gap.stream)
        out.append(dataclasses.replace(gap, stream=kind[0].name) if kind else gap)
    return out

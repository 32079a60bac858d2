"""``tjpipe fleet``: the files a fleet's servers run with, and its hub's fleet streams (``tjpipe.fleet_nats``).

Why files and not a running controller: a hub and each member are nats-servers configured by their operators
(a Secret, a ConfigMap, a file on a host), so the command writes what goes there, once per hub server and
per member, and sets up the streams at the hub with the hub's own admin identity, as ``bus-setup`` does for a
cluster. Seeds and keys are written mode 0600 and never printed; the hub's authorization block holds public
keys only.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:
    from tjpipe.fleet_nats import HubTls

console = Console(stderr=True, highlight=False, soft_wrap=True)

AUTHORIZATION_FILE = "hub-authorization.conf"
TLS_DIR = "tls"


def add_fleet_command(sub: Any, nats_client: Callable[[argparse.ArgumentParser], None]) -> None:
    """``tjpipe fleet credentials|hub-config|member-config|setup|status``; ``nats_client`` adds the NATS flags."""
    fleet_parser = sub.add_parser(
        "fleet", help="a fleet: the hub's and members' NATS files, and the hub's streams of every member's history"
    )
    commands = fleet_parser.add_subparsers(dest="fleet_command", required=True, metavar="COMMAND")

    creds = commands.add_parser(
        "credentials",
        help="seeds for the hub's identities and each member's leaf (kept if present), the hub's authorization "
        "block, and with --hub-host the leaf link's CA and certificates",
    )
    _folder(creds)
    _members(creds)
    creds.add_argument(
        "--hub-host",
        action="append",
        default=[],
        help="a DNS name or IP address members dial the hub's leaf port at (repeatable); makes <dir>/tls once",
    )

    hub = commands.add_parser("hub-config", help="one hub server's whole nats.conf (JetStream domain hub, leaf TLS)")
    _folder(hub)
    _members(hub)
    hub.add_argument("--name", required=True, help="this server's name (each of the three hub servers its own)")
    hub.add_argument("--listen", default="0.0.0.0:4222", help="client address (default 0.0.0.0:4222)")
    hub.add_argument("--monitor", default="0.0.0.0:8222", help="monitoring address (default 0.0.0.0:8222)")
    hub.add_argument("--cluster-listen", default="0.0.0.0:6222", help="route address (default 0.0.0.0:6222)")
    hub.add_argument("--leaf-listen", default="0.0.0.0:7422", help="leaf node address (default 0.0.0.0:7422)")
    hub.add_argument("--route", action="append", required=True, help="another hub server's HOST:PORT (repeatable)")
    hub.add_argument("--store-dir", required=True, help="this server's JetStream store")
    hub.add_argument("--route-password-file", type=Path, required=True, help="file holding the routes' shared password")
    hub.add_argument(
        "--client-tls",
        metavar="DIR",
        help="serve the client port over TLS too, with DIR/tls.crt, DIR/tls.key and DIR/ca.crt as the server "
        "reads them (a mounted Secret; `tjpipe nats-tls` makes one)",
    )
    _mounted_tls(hub)
    _out(hub)

    member = commands.add_parser(
        "member-config", help="what a member's nats.conf adds: its JetStream domain and its leaf remote to the hub"
    )
    _folder(member)
    member.add_argument("--cluster", required=True, help="the member's name (its JetStream domain)")
    member.add_argument("--hub", action="append", required=True, help="a hub server's leaf HOST:PORT (repeatable)")
    member.add_argument("--store-dir", required=True, help="the member's JetStream store")
    member.add_argument("--max-memory-store", type=_size, help="the member's JetStream memory limit, e.g. 256MB")
    member.add_argument(
        "--max-file-store", type=_size, help="the member's JetStream disk limit, e.g. 8GB (below its volume's size)"
    )
    _mounted_tls(member)
    _out(member)

    setup = commands.add_parser(
        "setup", help="create or update each member's fleet streams at the hub; needs the fleet-admin seed"
    )
    _members(setup)
    nats_client(setup)

    status = commands.add_parser(
        "status",
        help="each fleet stream's copy of each member: lag, records it never got (lost), last contact, error",
    )
    nats_client(status)

    monitor = commands.add_parser(
        "monitor",
        help="serve each member's lag and lost records at the hub as metrics (tjpipe_fleet_source_lag, "
        "tjpipe_fleet_source_gap_records); needs the fleet-reader seed",
    )
    monitor.add_argument(
        "--metrics-port", type=int, default=9090, help="serve /metrics, /healthz and /readyz here (default 9090)"
    )
    monitor.add_argument(
        "--interval", type=float, default=30.0, help="seconds between two reads of the fleet streams (default 30)"
    )
    nats_client(monitor)


def _folder(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, required=True, help="the fleet's folder of seeds and certificates (0700)")


def _members(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--member", action="append", required=True, help="a member cluster's name, a DNS label (repeatable)"
    )


def _size(value: str) -> str:
    from tjpipe.fleet_nats import check_store_size

    try:
        return check_store_size(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _mounted_tls(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mounted-tls",
        metavar="DIR",
        help="the server reads the leaf link's certificate, key and CA from DIR/tls.crt, DIR/tls.key, DIR/ca.crt "
        "(a mounted Kubernetes TLS Secret, as cert-manager writes one) instead of from <dir>/tls",
    )


def _tls_paths(args: argparse.Namespace, cert: Path, key: Path, ca: Path) -> tuple[str, str, str]:
    """Certificate, key and CA as the server names them: the local files (checked), or where they are mounted."""
    local = tuple(str(_existing(path)) for path in (cert, key, ca))
    if not args.mounted_tls:
        return local[0], local[1], local[2]
    folder = args.mounted_tls.rstrip("/")
    return f"{folder}/tls.crt", f"{folder}/tls.key", f"{folder}/ca.crt"


def _client_tls(folder: str | None) -> HubTls | None:
    from tjpipe import fleet_nats

    if not folder:
        return None
    folder = folder.rstrip("/")
    return fleet_nats.HubTls(cert_file=f"{folder}/tls.crt", key_file=f"{folder}/tls.key", ca_file=f"{folder}/ca.crt")


def _out(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="write the configuration here (mode 0600)")


def run_fleet(args: argparse.Namespace) -> int:
    from contracts.fleet import FleetNameError
    from tjpipe.exits import UsageError

    try:
        if args.fleet_command == "credentials":
            return _credentials(args)
        if args.fleet_command == "hub-config":
            return _hub_config(args)
        if args.fleet_command == "member-config":
            return _member_config(args)
        return asyncio.run(_on_hub(args))
    except FleetNameError as exc:
        raise UsageError(str(exc)) from exc
    except FileNotFoundError as exc:
        raise UsageError(f"{exc.filename}: not found; run 'tjpipe fleet credentials' first") from exc


def _say(line: str) -> None:
    console.print(line, markup=False, emoji=False)


def _credentials(args: argparse.Namespace) -> int:
    from tjpipe import fleet_nats

    creds = fleet_nats.generate_fleet_credentials(args.dir, args.member)
    authorization = args.dir / AUTHORIZATION_FILE
    authorization.write_text(fleet_nats.hub_authorization(creds, args.member))
    _say(f"hub seeds in {args.dir / 'hub'}; leaf seeds in {args.dir / 'members'} (one per member, for it alone)")
    for cluster in args.member:
        _say(f"  {fleet_nats.leaf_identity(cluster)}: {creds.public_key(creds.leaf_seed(cluster))}")
    _say(f"hub authorization block (public keys only): {authorization}")
    tls = args.dir / TLS_DIR
    if args.hub_host and not (tls / "ca.crt").is_file():
        fleet_nats.write_fleet_tls(tls, args.hub_host, args.member)
        _say(f"leaf link CA, hub and member certificates in {tls}")
    elif args.hub_host:
        _say(f"{tls} kept: its CA signs only the members it was made for (delete it to make a new one)")
    return 0


def _hub_config(args: argparse.Namespace) -> int:
    from tjpipe import fleet_nats

    creds = fleet_nats.FleetCredentials(args.dir)
    tls = args.dir / TLS_DIR
    cert, key, ca = _tls_paths(args, tls / "hub.crt", tls / "hub.key", tls / "ca.crt")
    text = fleet_nats.hub_config(
        fleet_nats.HubServer(
            name=args.name,
            client_listen=args.listen,
            monitor_listen=args.monitor,
            cluster_listen=args.cluster_listen,
            leaf_listen=args.leaf_listen,
            store_dir=args.store_dir,
            routes=tuple(args.route),
        ),
        tls=fleet_nats.HubTls(cert_file=cert, key_file=key, ca_file=ca, verify_clients=True),
        authorization=fleet_nats.hub_authorization(creds, args.member),
        route_password=args.route_password_file.read_text().strip(),
        client_tls=_client_tls(args.client_tls),
    )
    fleet_nats.write_member_config(args.out, text)
    _say(f"hub server {args.name}: {args.out}")
    return 0


def _member_config(args: argparse.Namespace) -> int:
    from contracts.fleet import check_cluster_name
    from tjpipe import fleet_nats

    creds = fleet_nats.FleetCredentials(args.dir)
    tls = args.dir / TLS_DIR
    members = tls / "members"
    check_cluster_name(args.cluster)
    cert, key, ca = _tls_paths(args, members / f"{args.cluster}.crt", members / f"{args.cluster}.key", tls / "ca.crt")
    text = fleet_nats.member_config(
        cluster=args.cluster,
        store_dir=args.store_dir,
        hub_leaf_urls=args.hub,
        leaf_seed=_existing(creds.leaf_seed(args.cluster)).read_text(),
        ca_file=ca,
        client_cert=(cert, key),
        max_memory_store=args.max_memory_store,
        max_file_store=args.max_file_store,
    )
    fleet_nats.write_member_config(args.out, text)
    _say(f"member {args.cluster}: {args.out} (holds its leaf seed: keep it as private as a seed)")
    return 0


def _existing(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(2, "not found", str(path))
    return path


async def _on_hub(args: argparse.Namespace) -> int:
    from contracts.fleet import check_cluster_name
    from tjpipe import fleet_nats
    from tjpipe.nats_connection import connect_nats
    from tjpipe.operator_commands import route_logs

    route_logs(debug=args.debug)
    members = [check_cluster_name(cluster) for cluster in getattr(args, "member", None) or []]
    nc = await connect_nats(args, f"fleet-{args.fleet_command}")
    try:
        js = nc.jetstream()
        if args.fleet_command == "monitor":
            await _monitor(js, port=args.metrics_port, interval=args.interval)
            return 0
        if args.fleet_command == "setup":
            await fleet_nats.setup_fleet_streams(js, members)
            _say(f"fleet streams set up, sourcing {', '.join(members)}")
        gaps = {(gap.stream, gap.cluster): gap for gap in await fleet_nats.source_gaps(js)}
        lost = False
        for state in await fleet_nats.source_states(js):
            contact = "not connected" if state.active_seconds is None else f"{state.active_seconds:.1f}s ago"
            error = f", error: {state.error}" if state.error else ""
            gap = gaps.get((state.stream, state.cluster))
            missing = gap.missing if gap else 0
            lost = lost or missing > 0
            ranges = f" (origin {', '.join(f'{a}-{b}' for a, b in gap.ranges)})" if gap and missing else ""
            copied = f"lag {state.lag}\tlost {missing}{ranges}"
            print(f"{state.stream}\t{state.cluster}\t{copied}\tlast contact {contact}{error}", flush=True)
        if lost:
            _say(
                "the hub's copy lacks records a member no longer holds (its retention passed while its link was "
                "cut): they are not at the hub; see docs/operating.md, TjpipeFleetRecordsLost"
            )
    finally:
        await nc.close()
    return 0


async def _monitor(js: Any, *, port: int, interval: float, host: str = "0.0.0.0") -> None:
    """Every ``interval`` seconds: each source's lag and the records its copy never got, as gauges.

    The copies are read once from the start, then only what the hub stored since (``fleet_nats.GapTracker``)."""
    import logging

    import nats.errors

    from plumbing import observability
    from tjpipe import fleet_nats

    log = logging.getLogger("tjpipe.fleet.monitor")
    health = observability.HealthServer(port=port, host=host, service="fleet-monitor")
    read = asyncio.Event()
    health.add_check("fleet streams read", read.is_set)
    await health.start()
    tracker = fleet_nats.GapTracker()
    try:
        while True:
            try:
                states = await fleet_nats.source_states(js)
                lost = {(gap.stream, gap.cluster): gap.missing for gap in await fleet_nats.source_gaps(js, tracker)}
                for state in states:
                    observability.FLEET_SOURCE_LAG.labels(state.stream, state.cluster).set(state.lag)
                    lost.setdefault((state.stream, state.cluster), 0)  # a source with no copy yet lost nothing
                for (stream, cluster), missing in lost.items():
                    observability.FLEET_SOURCE_GAP.labels(stream, cluster).set(missing)
                read.set()
            except (TimeoutError, nats.errors.Error) as exc:  # the next round tries again; /readyz shows one worked
                log.warning("reading the fleet streams failed: %s", exc)
            await asyncio.sleep(interval)
    finally:
        await health.stop()

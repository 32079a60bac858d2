"""``tjpipe``: run one service, or the whole local stack.

Every setting is a flag with an environment variable behind it (NATS_URL, KUBECONFIG, TJPIPE_NAMESPACES,
TJPIPE_LOG_LEVEL), so the same names work on a command line, in docker-compose and in a Deployment.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

console = Console(stderr=True, highlight=False, soft_wrap=True)


def _env_list(name: str) -> list[str]:
    return [v.strip() for v in os.environ.get(name, "").split(",") if v.strip()]


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", default=os.environ.get("TJPIPE_LOG_LEVEL", "info"))
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get("TJPIPE_METRICS_PORT", "9090")),
        help="serve /metrics, /healthz and /readyz here (env TJPIPE_METRICS_PORT; 0 turns it off)",
    )
    parser.add_argument(
        "--replica-id",
        default=os.environ.get("TJPIPE_REPLICA_ID", ""),
        help="name of this replica in partition leases (env TJPIPE_REPLICA_ID; default host-pid)",
    )
    parser.add_argument(
        "--log-format", choices=("json", "text", "auto"), default=os.environ.get("TJPIPE_LOG_FORMAT", "auto")
    )


def _nats(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nats-url", default=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"), help="env: NATS_URL")
    parser.add_argument(
        "--nats-creds",
        default=os.environ.get("NATS_CREDS"),
        help="this process's NATS identity: an nkey seed file or a JWT .creds file (env NATS_CREDS)",
    )
    parser.add_argument(
        "--nats-tls-ca",
        default=os.environ.get("NATS_TLS_CA"),
        help="CA file that signed the NATS server (env NATS_TLS_CA)",
    )
    parser.add_argument(
        "--nats-tls-cert",
        default=os.environ.get("NATS_TLS_CERT"),
        help="client certificate, if the server asks for one (env NATS_TLS_CERT)",
    )
    parser.add_argument(
        "--nats-tls-key", default=os.environ.get("NATS_TLS_KEY"), help="its private key (env NATS_TLS_KEY)"
    )


def nats_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``plumbing.bus.connect`` keyword arguments the NATS flags name."""
    from tjpipe.plumbing.bus import TlsFiles

    tls = TlsFiles.from_options(args.nats_tls_ca, args.nats_tls_cert, args.nats_tls_key)
    return {"creds": args.nats_creds or None, "tls": tls}


def _kube(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="env: KUBECONFIG; unset inside a cluster means in-cluster credentials",
    )


def _signing_key(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--signing-key",
        default=os.environ.get("TJPIPE_SIGNING_KEY"),
        help="this stage's ed25519 private key, PEM (env TJPIPE_SIGNING_KEY); required",
    )


def _trusted_keys(parser: argparse.ArgumentParser, kind: str, made_by: str) -> None:
    parser.add_argument(
        f"--trusted-{kind}-keys",
        default=os.environ.get(f"TJPIPE_TRUSTED_{kind.upper()}_KEYS"),
        help=f"the {made_by}'s ed25519 public keys: a file, or a directory of *.pub files "
        f"(env TJPIPE_TRUSTED_{kind.upper()}_KEYS); required",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tjpipe", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)

    watcher = sub.add_parser("watcher", help="list and watch TrainJobs, runtimes and JobSets; publish events")
    _common(watcher)
    _nats(watcher)
    _kube(watcher)
    watcher.add_argument(
        "--namespace",
        action="append",
        default=_env_list("TJPIPE_NAMESPACES"),
        help="namespace to watch (repeatable; env TJPIPE_NAMESPACES, comma-separated); default: all",
    )
    watcher.add_argument("--resync-seconds", type=float, default=300.0)
    _signing_key(watcher)

    planner = sub.add_parser("planner", help="turn events into per-component apply configurations")
    _common(planner)
    _nats(planner)
    _signing_key(planner)
    _trusted_keys(planner, "event", "watcher")

    applier = sub.add_parser("applier", help="server-side apply each planned component")
    _common(applier)
    _nats(applier)
    _kube(applier)
    applier.add_argument("--concurrency", type=int, default=int(os.environ.get("TJPIPE_APPLY_CONCURRENCY", "16")))
    applier.add_argument(
        "--stale-claim-grace",
        type=float,
        default=float(os.environ.get("TJPIPE_STALE_CLAIM_GRACE", "330")),
        help="seconds a ledger claim newer than the cluster may hold a target before it is overwritten",
    )
    applier.add_argument(
        "--trainjob-cache-seconds",
        type=float,
        default=float(os.environ.get("TJPIPE_TRAINJOB_CACHE_SECONDS", "5")),
        help="seconds a TrainJob verified against the cluster is trusted without reading it again",
    )
    _trusted_keys(applier, "plan", "planner")

    webhook = sub.add_parser(
        "webhook", help="serve Trainer's validating admission webhooks (TrainJob, runtimes) over TLS"
    )
    _common(webhook)
    _kube(webhook)
    webhook.add_argument(
        "--port", type=int, default=int(os.environ.get("TJPIPE_WEBHOOK_PORT", "9443")), help="env TJPIPE_WEBHOOK_PORT"
    )
    webhook.add_argument(
        "--host", default=os.environ.get("TJPIPE_WEBHOOK_HOST", "0.0.0.0"), help="env TJPIPE_WEBHOOK_HOST"
    )
    webhook.add_argument(
        "--tls-cert",
        default=os.environ.get("TJPIPE_WEBHOOK_TLS_CERT", "/etc/tjpipe/webhook-tls/tls.crt"),
        help="serving certificate, PEM (env TJPIPE_WEBHOOK_TLS_CERT)",
    )
    webhook.add_argument(
        "--tls-key",
        default=os.environ.get("TJPIPE_WEBHOOK_TLS_KEY", "/etc/tjpipe/webhook-tls/tls.key"),
        help="its private key, PEM (env TJPIPE_WEBHOOK_TLS_KEY)",
    )

    up = sub.add_parser(
        "up", help="run the embedded local stack (NATS, kube-apiserver, the three services and the webhook)"
    )
    up.add_argument("--demo", action="store_true", help="install torch-distributed and create a sample TrainJob")
    up.add_argument("--detach", action="store_true", help="leave the stack running in the background")
    up.add_argument("--state-dir", type=Path, default=Path(".tjpipe"))

    setup = sub.add_parser(
        "bus-setup",
        help="create or update the streams, durable consumers and KV buckets; needs the admin NATS identity",
    )
    _nats(setup)

    creds = sub.add_parser(
        "nats-credentials",
        help="make an nkey seed per NATS identity (kept if present) and the server's authorization block",
    )
    creds.add_argument("--dir", type=Path, required=True, help="folder for <identity>.nk (mode 0700, files 0600)")
    creds.add_argument(
        "--authorization", type=Path, help="write the nats-server authorization block (public keys only) here"
    )
    creds.add_argument("--rotate", action="store_true", help="replace every seed with a new one")

    tls = sub.add_parser(
        "nats-tls",
        help="make a private CA and a NATS server certificate (ca.crt, tls.crt, tls.key): the self-signed path",
    )
    tls.add_argument("--dir", type=Path, required=True, help="folder for ca.crt, tls.crt and tls.key (0600)")
    tls.add_argument(
        "--host", action="append", required=True, help="a DNS name or IP address the certificate is for (repeatable)"
    )

    down = sub.add_parser("down", help="stop a stack started with 'tjpipe up --detach'")
    down.add_argument("--state-dir", type=Path, default=Path(".tjpipe"))

    hist = sub.add_parser("history", help="the timeline of one TrainJob: events, plans, results, dead letters")
    hist.add_argument("trainjob", metavar="NAMESPACE/NAME")
    hist.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    _nats(hist)

    rep = sub.add_parser("replay", help="plan recorded events again offline and diff against the recorded plans")
    rep.add_argument("trainjob", metavar="NAMESPACE/NAME", nargs="?")
    rep.add_argument("--all", action="store_true", help="every TrainJob in the window")
    rep.add_argument("--since", help="ISO time or a duration such as 2h or 30m")
    rep.add_argument("--from-seq", type=int, help="first event stream sequence to replay")
    rep.add_argument("-o", "--output", choices=("table", "json"), default="table")
    _nats(rep)

    pl = sub.add_parser("plan", help="print the components a TrainJob would produce, without applying anything")
    pl.add_argument("-f", "--file", type=Path, required=True, help="TrainJob YAML")
    source = pl.add_mutually_exclusive_group()
    source.add_argument("--runtime", type=Path, help="runtime YAML (TrainingRuntime or ClusterTrainingRuntime)")
    source.add_argument("--from-cluster", action="store_true", help="read the runtime from the cluster")
    pl.add_argument("--server-dry-run", action="store_true", help="SSA with dryRun=All; diff against live objects")
    _kube(pl)

    dlq = sub.add_parser("dlq", help="inspect dead letters and send them back into the pipeline")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True)
    dlq_list = dlq_sub.add_parser("list", help="every dead letter")
    dlq_list.add_argument("-o", "--output", choices=("table", "json"), default="table")
    show = dlq_sub.add_parser("show", help="one dead letter, with its payload")
    show.add_argument("seq", type=int)
    retry = dlq_sub.add_parser("retry", help="republish dead letters to their original subjects")
    retry.add_argument("seq", type=int, nargs="*")
    retry.add_argument("--all", action="store_true")
    for p in dlq_sub.choices.values():
        _nats(p)

    keys = sub.add_parser("keys", help="the stages' message-signing keys: make, rotate, retire")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    keys_sub.add_parser("init", help="a signing key for the watcher and the planner, and the keyrings trusting them")
    rot = keys_sub.add_parser("rotate", help="trust a new key for STAGE, then sign with it (the old stays trusted)")
    rot.add_argument("stage", choices=("watcher", "planner"))
    ret = keys_sub.add_parser("retire", help="stop trusting an old key of STAGE")
    ret.add_argument("stage", choices=("watcher", "planner"))
    ret.add_argument("key_id")
    keys_sub.add_parser("list", help="the key each stage signs with, and the keys trusted")
    for p in keys_sub.choices.values():
        p.add_argument(
            "--dir",
            type=Path,
            default=Path(".tjpipe/keys"),
            help="key folder: watcher.key, planner.key (0600), trusted-events/ and trusted-plans/ (*.pub)",
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command: str = args.command
    if command in ("watcher", "planner", "applier"):
        return _run_service(command, args)
    if command == "webhook":
        return _run_webhook(args)
    if command == "up":
        return _up(args)
    if command == "down":
        return _down(args)
    if command == "keys":
        return _keys(args)
    if command == "bus-setup":
        return asyncio.run(_bus_setup(args))
    if command == "nats-credentials":
        return _nats_credentials(args)
    if command == "nats-tls":
        from tjpipe.credentials import write_self_signed_tls

        written = write_self_signed_tls(args.dir, args.host)
        console.print(f"NATS TLS: {', '.join(str(p) for p in written.values())} for {', '.join(args.host)}")
        return 0
    from tjpipe import opscli

    return opscli.run(command, args)


# ------------------------------------------------------------------------------------------- services


def _run_service(command: str, args: argparse.Namespace) -> int:
    from tjpipe.plumbing.bus import CredentialsError, NotAuthorized
    from tjpipe.plumbing.signing import KeyMaterialError

    try:
        return _start_service(command, args)
    except (KeyMaterialError, CredentialsError, NotAuthorized) as exc:  # secure by default: no keys, no service
        print(f"tjpipe {command}: {exc}", file=sys.stderr)
        return 2


def _start_service(command: str, args: argparse.Namespace) -> int:
    from tjpipe.plumbing.runner import configure_logging, run_service

    fmt = {"json": True, "text": False, "auto": None}[args.log_format]
    configure_logging(args.log_level, json_logs=fmt)
    # What every service is started with (plumbing.runner.ServiceSettings), parsed once here.
    common: dict[str, Any] = {
        "nats_url": args.nats_url,
        "metrics_port": args.metrics_port,
        "nats_creds": args.nats_creds or None,
        "nats_tls": nats_options(args)["tls"],
    }
    if command == "watcher":
        from tjpipe.watcher.service import WatcherSettings, run_watcher

        ws = WatcherSettings(
            **common,
            kubeconfig=args.kubeconfig,
            namespaces=tuple(dict.fromkeys(args.namespace)),
            resync_seconds=args.resync_seconds,
            signing_key=args.signing_key,
        )
        return run_service(lambda stop: run_watcher(ws, stop))
    if command == "planner":
        from tjpipe.planner.service import PlannerSettings, run_planner

        ps = PlannerSettings(**common, signing_key=args.signing_key, trusted_event_keys=args.trusted_event_keys)
        if args.replica_id:
            ps.replica = args.replica_id
        return run_service(lambda stop: run_planner(ps, stop))
    from tjpipe.applier.service import ApplierSettings, run_applier

    aps = ApplierSettings(
        **common,
        kubeconfig=args.kubeconfig,
        concurrency=args.concurrency,
        stale_claim_grace_seconds=args.stale_claim_grace,
        trainjob_cache_seconds=args.trainjob_cache_seconds,
        trusted_plan_keys=args.trusted_plan_keys,
    )
    if args.replica_id:
        aps.replica = args.replica_id
    return run_service(lambda stop: run_applier(aps, stop))


def _run_webhook(args: argparse.Namespace) -> int:
    from tjpipe.planner.webhook import WebhookSettings, run_webhook
    from tjpipe.plumbing.runner import configure_logging, run_service

    configure_logging(args.log_level, json_logs={"json": True, "text": False, "auto": None}[args.log_format])
    settings = WebhookSettings(
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        port=args.port,
        host=args.host,
        metrics_port=args.metrics_port,
        kubeconfig=args.kubeconfig,
    )
    for path in (settings.tls_cert, settings.tls_key):
        if not Path(path).is_file():
            print(f"tjpipe webhook: no such file: {path} (--tls-cert/--tls-key)", file=sys.stderr)
            return 2
    return run_service(lambda stop: run_webhook(settings, stop))


# ------------------------------------------------------------------------------------------- the bus


async def _bus_setup(args: argparse.Namespace) -> int:
    from tjpipe.contracts import streams
    from tjpipe.plumbing import bus

    try:
        nc = await bus.connect(args.nats_url, name="tjpipe-bus-setup", **nats_options(args))
        try:
            await bus.setup_bus(
                nc.jetstream(), streams.configured_streams(os.environ), replicas=streams.stream_replicas(os.environ)
            )
        finally:
            await nc.close()
    except (bus.NotAuthorized, bus.CredentialsError) as exc:
        console.print(f"[red]tjpipe bus-setup: {exc}[/]")
        return 2
    console.print("bus set up: streams, per-partition consumers, KV buckets")
    return 0


def _nats_credentials(args: argparse.Namespace) -> int:
    from tjpipe import credentials

    creds = credentials.generate_credentials(args.dir, replace=args.rotate)
    console.print(f"NATS identities in {creds.root}: {', '.join(credentials.IDENTITIES)}")
    if args.authorization:
        credentials.write_authorization(creds, args.authorization)
        console.print(f"authorization block (public keys only): {args.authorization}")
    return 0


# ------------------------------------------------------------------------------------------- up / down


def _up(args: argparse.Namespace) -> int:
    from tjpipe.local.toolchain import ToolchainMissing
    from tjpipe.stack import Stack, StatePaths

    paths = StatePaths(args.state_dir.resolve())
    if any(paths.logs.glob("*.pid")):
        console.print(f"[yellow]a stack seems to be running already ({paths.logs}); run 'tjpipe down' first[/]")
        return 1
    stack = Stack(paths=paths, progress=lambda line: console.print(f"[dim]·[/] {line}"))
    try:
        stack.start_infrastructure()
        stack.start_services()
        stack.start_webhook()
        demo = stack.create_demo() if args.demo else None
        _where(stack)
        if args.detach:
            console.print("[green]stack running in the background[/]; stop it with [bold]tjpipe down[/]")
            stack.services.clear()  # detached: leave every process to 'tjpipe down'
            stack.local_kube = None
            stack.local_nats = None
            stack.webhook_url = ""  # keep its configuration: the webhook keeps running
            return 0
        console.print("[green]stack running[/]; press [bold]Ctrl-C[/] to stop everything")
        asyncio.run(_follow(stack, demo))
    except ToolchainMissing as exc:
        console.print(f"[red]{exc}[/]")
        return 2
    except KeyboardInterrupt:
        console.print("\nstopping…")
    finally:
        stack.stop()
    console.print("stopped; no process left running")
    return 0


def _where(stack: Any) -> None:
    paths = stack.paths
    console.print(f"state folder: {paths.root}")
    if stack.local_kube is not None:
        console.print(f"  kubeconfig: {paths.kubeconfig}")
    console.print(f"  env:        {paths.env_file}   (source it: . {paths.env_file})")
    if getattr(stack, "credentials", None) is not None:
        console.print(
            f"  NATS ids:   {stack.credentials.root}   (the env file picks reader.nk; dlq retry needs dlq-operator.nk)"
        )
    console.print(f"  logs, pids: {paths.logs}")


def _down(args: argparse.Namespace) -> int:
    from tjpipe.stack import StatePaths, stop_detached

    stopped = stop_detached(StatePaths(args.state_dir.resolve()))
    if stopped:
        console.print(f"stopped: {', '.join(stopped)}")
    else:
        console.print("nothing was running")
    return 0


def _keys(args: argparse.Namespace) -> int:
    from tjpipe.local.signing_keys import STAGES, KeyFolder
    from tjpipe.plumbing.signing import KeyMaterialError

    sub: str = args.keys_command
    folder = KeyFolder(args.dir.resolve())
    try:
        if sub == "init":
            folder.ensure()
            console.print(f"keys in {folder.root}: " + ", ".join(f"{s} {folder.current_key_id(s)}" for s in STAGES))
        elif sub == "rotate":
            old, new = folder.rotate(args.stage)
            console.print(
                f"{args.stage} now signs with {new} (running services pick it up within seconds); {old} is still "
                f"trusted for messages signed before. Once they are consumed: tjpipe keys retire {args.stage} {old}"
            )
        elif sub == "retire":
            removed = folder.retire(args.stage, args.key_id)
            console.print(f"{args.stage} key {args.key_id} is no longer trusted (removed {removed})")
        else:
            for stage in STAGES:
                trusted = ", ".join(folder.trusted_key_ids(stage))
                console.print(f"{stage}: signs with {folder.current_key_id(stage)}; trusted: {trusted}")
    except (KeyMaterialError, ValueError) as exc:
        console.print(f"[red]{exc}[/]")
        return 1
    return 0


async def _follow(stack: Any, demo: tuple[str, str] | None) -> None:
    """Print every apply result as it happens, and the demo JobSet's shape once it exists."""
    import logging

    import msgspec

    from tjpipe.contracts import streams, subjects
    from tjpipe.contracts.messages import decode_result
    from tjpipe.plumbing import bus

    logging.getLogger("tjpipe.plumbing.bus").setLevel(logging.ERROR)
    # Read-only: the results are polled with direct gets, as the reader identity.
    nc = await bus.connect(stack.nats_url, name="tjpipe-up", **stack.nats_connect_options("reader"))
    js = nc.jetstream()
    shown = False
    next_seq = 1
    try:
        while True:
            for process in stack.services:
                if not process.is_running():
                    console.print(f"[red]{process.name} exited[/]; last log lines:\n{process.log_tail()}")
                    return
            try:
                stored = await bus.read_stream(
                    js, streams.RESULTS.name, f"{subjects.RESULTS_PREFIX}.>", start_seq=next_seq
                )
            except Exception:
                stored = []
            if not stored:
                await asyncio.sleep(0.5)
                continue
            next_seq = stored[-1].seq + 1
            for msg in stored:
                try:
                    result = decode_result(msg.data)
                except msgspec.DecodeError:
                    continue
                colour = {"created": "green", "configured": "cyan", "unchanged": "dim", "failed": "red"}.get(
                    result.action, "yellow"
                )
                console.print(
                    f"[{colour}]{result.action:>10}[/] {result.target}  "
                    f"({result.attempts} attempt{'s' if result.attempts != 1 else ''}, {result.duration_ms:.0f} ms)"
                    + (f" — {result.reason}" if result.reason else "")
                )
                if demo and not shown and result.component == "jobset" and result.action in ("created", "configured"):
                    shown = True
                    _show_jobset(stack, *demo)
    finally:
        await nc.close()


def _show_jobset(stack: Any, namespace: str, name: str) -> None:
    from kubernetes import dynamic

    from tjpipe.local.kubeapi import new_api_client

    client = dynamic.DynamicClient(new_api_client(stack.kubeconfig))  # type: ignore[no-untyped-call]
    jobsets = client.resources.get(api_version="jobset.x-k8s.io/v1alpha2", kind="JobSet")
    js = jobsets.get(namespace=namespace, name=name).to_dict()
    owner = js["metadata"]["ownerReferences"][0]
    managers = sorted({f"{m['manager']}/{m['operation']}" for m in js["metadata"].get("managedFields", [])})
    console.print(
        f"[bold]JobSet {namespace}/{name}[/]  suspend={js['spec'].get('suspend', False)}  "
        f"owner={owner['kind']}/{owner['name']} (controller={owner.get('controller')})  "
        f"managers={', '.join(managers)}"
    )
    for rj in js["spec"]["replicatedJobs"]:
        jspec = rj["template"]["spec"]
        console.print(
            f"  replicatedJob [bold]{rj['name']}[/]: replicas={rj.get('replicas', 1)} "
            f"parallelism={jspec.get('parallelism', 1)} completions={jspec.get('completions', 1)}"
        )
        for c in jspec["template"]["spec"]["containers"]:
            console.print(f"    container {c['name']}  image={c.get('image', '')}")
            console.print(f"      command: {' '.join(c.get('command', []) + c.get('args', []))}")
            for kind, values in (c.get("resources") or {}).items():
                console.print(f"      {kind}: " + " ".join(f"{k}={v}" for k, v in values.items()))
            env = " ".join(
                f"{e['name']}={e.get('value', '<from ' + next(iter(e.get('valueFrom', {})), '?') + '>')}"
                for e in c.get("env", [])
            )
            console.print(f"      env: {env}")
            ports = ", ".join(str(p["containerPort"]) for p in c.get("ports", []))
            console.print(f"      ports: {ports}")
    console.print(f"[green]JobSet applied at {time.strftime('%H:%M:%S')}[/]; watching for further changes…")


if __name__ == "__main__":
    sys.exit(main())

"""``tjpipe``: run one service, or the whole local stack.

Every setting is a flag with an environment variable behind it (NATS_URL, KUBECONFIG, TJPIPE_NAMESPACES,
TJPIPE_LOG_LEVEL), so the same names work on a command line, in docker-compose and in a Deployment. A
service's settings are declared once, on its settings dataclass (``plumbing.configuration``), and its
command's flags are made from them (``SERVICE_SETTINGS``).

This module is the shell: it declares the commands and hands each to the module that does it (a service,
``tjpipe.local.stack`` for ``up``, ``tjpipe.demo`` for what the demo prints, ``tjpipe.operator_commands``
for the operator commands, ``tjpipe.nats_connection`` for reaching NATS). Imports sit inside the functions
on purpose, here and in ``operator_commands``: parsing, ``--help`` and shell completion load argparse, rich
and the settings only, and a command loads the NATS or kubernetes client, or a service, when it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from rich.console import Console
from rich.markup import escape

from applier.settings import ApplierSettings
from history_server.settings import HistoryServerSettings
from planner.settings import PlannerSettings, WebhookSettings
from plumbing.configuration import ConnectSettings, KubeSettings, ProcessSettings, declared, positive_seconds
from status_server.settings import StatusServerSettings
from tjpipe import settings
from tjpipe.nats_connection import add_nats_flags
from tjpipe.settings import (
    SIGNING_STAGES,
    STAGE_SETTINGS,
    STAGES,
    FromEnvironment,
    SettingsError,
    add_setting,
    add_settings,
    add_trainjob_status_flags,
)
from watcher.settings import WatcherSettings

if TYPE_CHECKING:
    from contracts.streams import BucketSpec, StreamSpec

console = Console(stderr=True, highlight=False, soft_wrap=True)


SERVICE_SETTINGS: dict[str, tuple[type, ...]] = {
    "watcher": (WatcherSettings,),
    "planner": (PlannerSettings,),
    "applier": (ApplierSettings,),
    "controller": (ProcessSettings, WatcherSettings, PlannerSettings, ApplierSettings),
    "webhook": (WebhookSettings,),
    "status-server": (StatusServerSettings,),
}
"""The settings each service command takes, each declared once on its dataclass (``plumbing.configuration``)."""

SERVICE_HELP = {
    "watcher": "list and watch TrainJobs, runtimes and JobSets; publish events",
    "planner": "turn events into per-component apply configurations",
    "applier": "server-side apply each planned component",
    "controller": "the watcher, planner and applier in one process, each with its own NATS identity and keys "
    "(about half the memory; for a small cluster)",
    "webhook": "serve Trainer's validating admission webhooks (TrainJob, runtimes) over TLS",
    "status-server": "serve Trainer's TrainJob status endpoint over TLS: progress from the pods, recorded in the "
    "history, written to status.trainerStatus coalesced",
}


def _kube(parser: argparse.ArgumentParser) -> None:
    add_settings(parser, KubeSettings)


def build_parser() -> argparse.ArgumentParser:
    from tjpipe.exits import EPILOG

    parser = _Parser(
        prog="tjpipe",
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tjpipe {_version()}", help="print the version")
    parser.add_argument(
        "--debug", action="store_true", help="print a traceback with an error (env: TJPIPE_DEBUG=1 does the same)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for command, types in SERVICE_SETTINGS.items():
        service = sub.add_parser(command, help=SERVICE_HELP[command])
        add_settings(service, *types, stages=STAGE_SETTINGS if command == "controller" else None)

    _add_local_stack_commands(sub)
    _add_bus_commands(sub)
    from tjpipe.fleet_command import add_fleet_command

    add_fleet_command(sub, _nats_client)
    _add_operator_commands(sub)
    _debug_flag_everywhere(parser)
    _name_docs_pages(parser)
    return parser


def _add_local_stack_commands(sub: Any) -> None:
    """``tjpipe up`` and ``tjpipe demo``: the stack on this machine, and the demo on a running cluster."""
    up = sub.add_parser(
        "up",
        help="run the embedded local stack: NATS, a simulated cluster (kube-apiserver, controllers, scheduler, JobSet, "
        "kwok nodes), the three services and the webhook",
    )
    up.add_argument(
        "--demo",
        action="store_true",
        help="create a sample TrainJob on torch-distributed (and, on the simulated cluster, one on "
        "deepspeed-distributed), follow them to Complete, then delete them and show the clean-up",
    )
    up.add_argument("--detach", action="store_true", help="leave the stack running in the background")
    up.add_argument(
        "--one-process",
        action="store_true",
        help="run the three stages as one 'tjpipe controller' process instead of three services",
    )
    up.add_argument(
        "--state-dir", type=Path, default=Path(".tjpipe"), help="the stack's state folder (default: .tjpipe)"
    )
    simulated = up.add_argument_group(
        "simulated cluster",
        "By default the stack's own apiserver gets kube-controller-manager, kube-scheduler, JobSet's manager "
        "with its webhooks, and kwok nodes: Jobs make pods, pods run (no containers) and finish.",
    )
    simulated.add_argument(
        "--control-plane-only",
        action="store_true",
        help="run etcd and kube-apiserver only: TrainJobs get their JobSets, nothing runs them",
    )
    simulated.add_argument(
        "--real-node",
        action="store_true",
        help="one real node instead of the simulated ones: kubelet, containerd with runc, CNI, kube-proxy and CoreDNS, "
        "built from their Go modules; pods run containers on this machine (root; images from "
        "bash scripts/node-images.sh)",
    )
    simulated.add_argument("--nodes", type=int, default=4, help="simulated nodes (default 4: 32 cpu, 8 GPUs each)")
    simulated.add_argument(
        "--pod-run-seconds",
        type=float,
        default=None,
        help="how long a simulated pod runs before it succeeds (default 5, with --demo 20: long enough for the "
        "training stand-in to report progress a few times; per pod: annotation sim.tjpipe.local/run-time)",
    )
    adopt = up.add_argument_group(
        "existing servers",
        "By default the stack runs its own NATS and kube-apiserver on 127.0.0.1, whatever KUBECONFIG and "
        "NATS_URL say. To write to existing servers instead, name them here.",
    )
    adopt.add_argument(
        "--kubeconfig",
        type=Path,
        help="adopt the cluster of this kubeconfig's current context (the CRDs must be installed already)",
    )
    adopt.add_argument(
        "--nats-url",
        help="adopt this NATS server (credentials: TJPIPE_NATS_CREDS_DIR, a folder of <identity>.nk it trusts)",
    )
    adopt.add_argument(
        "--use-env",
        action="store_true",
        help="adopt what KUBECONFIG and NATS_URL name (those set; the flags above win)",
    )

    demo = sub.add_parser(
        "demo",
        help="on the running cluster KUBECONFIG names (the compose stack's `demo` service): create the demo "
        "TrainJobs, follow them to Complete, delete them and show the clean-up",
    )
    _kube(demo)
    demo.add_argument("--timeout", type=positive_seconds, default=600.0, help="give up after this many seconds")


def _add_bus_commands(sub: Any) -> None:
    """``tjpipe bus-setup``, ``nats-credentials`` and ``nats-tls``: the bus, its identities and its certificate."""
    setup = sub.add_parser(
        "bus-setup",
        help="create or update the streams, durable consumers and KV buckets; needs the admin NATS identity",
        description="Stream retention comes from the environment: "
        f"TJPIPE_<{_stream_names()}>_MAX_AGE (e.g. 30d) and _MAX_BYTES "
        "(e.g. 2gi); stream and KV replicas from TJPIPE_STREAM_REPLICAS (default 1). A bus made by an earlier "
        "version is upgraded in place: the history streams first, then the work streams' retention.",
    )
    _nats_client(setup)
    setup.set_defaults(bus=FromEnvironment(_stream_settings))

    creds = sub.add_parser(
        "nats-credentials",
        help="make an nkey seed per NATS identity (kept if present) and the server's authorization block",
    )
    _nats_credentials_flags(creds, argparse.SUPPRESS)
    creds.add_argument(
        "--rotate", action="store_true", help="replace every seed at once (no overlap: restart everything after)"
    )
    rotation = creds.add_subparsers(dest="creds_command", metavar="rotate")
    rotate = rotation.add_parser(
        "rotate",
        help="rotate seeds without downtime: begin (trust a second key), swap (use it), finish (drop the old)",
        description="begin: a new seed per identity (<identity>.nk.next), both keys in the authorization block, "
        "reload; swap: the new seeds replace the old (services reconnect with them); finish: the old keys leave "
        "the block, reload. status: where each identity is.",
    )
    rotate.add_argument("step", choices=("begin", "swap", "finish", "status"), help="the step to run")
    _nats_credentials_flags(rotate, argparse.SUPPRESS)
    rotate.add_argument("--identity", action="append", help="rotate only these identities (repeatable; begin)")
    rotate.add_argument("--reload", metavar="PID|PIDFILE", help="the nats-server to reload after begin and finish")
    rotate.add_argument("--monitor", metavar="URL", help="its monitoring URL: reloads confirmed, reconnects awaited")
    rotate.add_argument("--wait", type=positive_seconds, default=120.0, help="finish: wait this long for reconnects")

    tls = sub.add_parser(
        "nats-tls",
        help="make a private CA and a NATS server certificate (ca.crt, tls.crt, tls.key): the self-signed path",
    )
    tls.add_argument("--dir", type=Path, required=True, help="folder for ca.crt, tls.crt and tls.key (0600)")
    tls.add_argument(
        "--host", action="append", required=True, help="a DNS name or IP address the certificate is for (repeatable)"
    )


DOCS_PAGES = {
    "": "docs/index.md",
    "watcher": "docs/configuration.md",
    "planner": "docs/configuration.md",
    "applier": "docs/configuration.md",
    "controller": "docs/configuration.md",
    "webhook": "docs/behaviour.md#admission-webhook-tjpipe-webhook",
    "status-server": "docs/training-progress.md#the-status-server",
    "bus-setup": "docs/deploying.md#kubernetes-deploy-kustomize",
    "up": "docs/getting-started.md",
    "demo": "docs/getting-started.md",
    "down": "docs/getting-started.md",
    "nats-credentials": "docs/security.md#nats-identities",
    "nats-credentials rotate": "docs/security.md#rotating-nats-seeds",
    "nats-tls": "docs/security.md#nats-identities",
    "fleet": "docs/fleet.md",
    "history": "docs/operating.md#history-replay-plan-dead-letters",
    "replay": "docs/operating.md#history-replay-plan-dead-letters",
    "plan": "docs/operating.md#history-replay-plan-dead-letters",
    "dlq": "docs/operating.md#history-replay-plan-dead-letters",
    "keys": "docs/security.md#rotating-keys",
    "history-server": "docs/operating.md#history-server",
    "completion": "docs/cli.md",
}
"""Each command's page of the documentation site (``mkdocs serve``), named at the end of its ``--help``.
A command not listed (a sub-command) takes its parent's page; tests/docs checks every page and anchor exists."""


def _name_docs_pages(parser: argparse.ArgumentParser, words: tuple[str, ...] = (), page: str = "") -> None:
    """End each parser's help with its page of the site; the reference of every flag is docs/reference/cli.md."""
    page = DOCS_PAGES.get(" ".join(words), page)
    line = f"documentation: {page}" + ("; every command and flag: docs/reference/cli.md" if not words else "")
    parser.epilog = f"{parser.epilog}\n\n{line}" if parser.epilog else line
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                _name_docs_pages(sub, (*words, name), page)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, with a usage error as one ``error: ...`` line like every other error (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        from tjpipe.exits import ExitCode

        _error(f"{message} (see: {self.prog} --help)")
        raise SystemExit(int(ExitCode.USAGE))


def _stream_names() -> str:
    """Every stream's setting prefix (``EVENTS|APPLY|…``), from the streams' declarations."""
    from contracts.streams import ALL_STREAMS

    return "|".join(spec.name.removeprefix("TJ_") for spec in ALL_STREAMS)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trainjob-pipeline")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


_positive_int.__name__ = "positive integer"


def _connect_timeout(parser: argparse.ArgumentParser, what: str) -> None:
    [timeout] = declared(ConnectSettings)
    add_setting(parser, dataclasses.replace(timeout, help=timeout.help.replace("from NATS", f"from {what}")))


def _nats_client(parser: argparse.ArgumentParser) -> None:
    """The NATS connection flags of a command that talks to the bus, and how long it waits for NATS."""
    add_nats_flags(parser)
    _connect_timeout(parser, "NATS")


def _output_format(parser: argparse.ArgumentParser, default: str, *others: str) -> None:
    """``-o/--output`` with the command's formats, the first one its default."""
    parser.add_argument(
        "-o", "--output", choices=(default, *others), default=default, help=f"output format (default: {default})"
    )


def _trainjob_argument(parser: argparse.ArgumentParser, *, optional: bool = False) -> None:
    parser.add_argument(
        "trainjob",
        metavar="[NAMESPACE/]NAME",
        nargs="?" if optional else None,
        help="the TrainJob, as NAMESPACE/NAME or NAME with -n NAMESPACE",
    )
    parser.add_argument("-n", "--namespace", help="the TrainJob's namespace, when NAME has none (default: default)")


def _fleet_cluster(parser: argparse.ArgumentParser) -> None:
    """``--cluster``: read one member cluster's records from the fleet streams at the hub."""
    parser.add_argument(
        "--cluster",
        help="read this member cluster's records from the fleet's hub (connect to the hub's NATS as "
        "fleet-reader) instead of this cluster's own streams",
    )


def _add_operator_commands(sub: Any) -> None:
    """The operator's commands: the stack's ``down``, the history tools, dead letters, signing keys, completion."""
    down = sub.add_parser("down", help="stop a stack started with 'tjpipe up --detach'")
    down.add_argument(
        "--state-dir", type=Path, default=Path(".tjpipe"), help="the stack's state folder (default: .tjpipe)"
    )
    down.add_argument(
        "--purge",
        action="store_true",
        help="then delete the state folder (cluster data, NATS streams, credentials, keys, logs) to start over; "
        "refused for a folder holding anything the stack did not make",
    )

    hist = sub.add_parser("history", help="the timeline of one TrainJob: events, plans, results, dead letters")
    _trainjob_argument(hist)
    hist.add_argument(
        "--every-progress",
        action="store_true",
        help="a row for each training progress update (the table folds a run of them into one; json and yaml never)",
    )
    _output_format(hist, "table", "json", "yaml")
    _nats_client(hist)
    _fleet_cluster(hist)

    rep = sub.add_parser(
        "replay",
        help="plan recorded events again offline and diff against the recorded plans (exit code 1: they differ)",
    )
    _trainjob_argument(rep, optional=True)
    rep.add_argument("--all", action="store_true", help="every TrainJob in the window instead of one")
    rep.add_argument("--since", help="replay events from this time: a duration ago (90s, 30m, 2h, 1d) or ISO 8601")
    rep.add_argument("--from-seq", type=_positive_int, help="first event stream sequence to replay")
    _output_format(rep, "table", "json", "yaml")
    _nats_client(rep)
    _fleet_cluster(rep)
    # Replayed as the planner plans: with TrainJobStatus when it ran with it (.tjpipe/env sets these).
    add_trainjob_status_flags(rep)

    pl = sub.add_parser(
        "plan",
        help="print the components a TrainJob would produce, without applying anything",
        description="Print the objects the pipeline would apply for a TrainJob, as YAML (or JSON). With "
        "--server-dry-run, apply them with dryRun=All and show how the cluster would change "
        "(exit code 1: it would).",
    )
    what = pl.add_mutually_exclusive_group(required=True)
    what.add_argument("-f", "--file", help="TrainJob YAML; it may also hold the runtime; - reads stdin")
    what.add_argument(
        "--from-history",
        metavar="[NAMESPACE/]NAME",
        help="plan the TrainJob as last recorded in the history (with the runtime recorded with it)",
    )
    source = pl.add_mutually_exclusive_group()
    source.add_argument("--runtime", help="runtime YAML (TrainingRuntime or ClusterTrainingRuntime); - reads stdin")
    source.add_argument("--from-cluster", action="store_true", help="read the runtime from the cluster")
    pl.add_argument(
        "--server-dry-run", action="store_true", help="apply with dryRun=All and diff against the live objects"
    )
    pl.add_argument("-n", "--namespace", help="the TrainJob's namespace, when its file names none")
    pl.add_argument(
        "-o",
        "--output",
        choices=("yaml", "json", "table"),
        help="yaml or json: the objects (default yaml), or the --server-dry-run diff as data; "
        "table: the --server-dry-run diff for people (its default)",
    )
    _kube(pl)
    _connect_timeout(pl, "the apiserver or NATS")
    add_nats_flags(pl)
    _fleet_cluster(pl)
    add_trainjob_status_flags(pl)

    dlq = sub.add_parser("dlq", help="inspect dead letters and send them back into the pipeline")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="COMMAND")
    dlq_list = dlq_sub.add_parser("list", help="every dead letter")
    _output_format(dlq_list, "table", "json", "yaml")
    show = dlq_sub.add_parser("show", help="one dead letter, with its payload decoded")
    show.add_argument("seq", type=_positive_int, metavar="SEQ", help="the dead letter's sequence (dlq list)")
    _output_format(show, "yaml", "json")
    retry = dlq_sub.add_parser(
        "retry", help="republish dead letters to their original subjects (needs the dlq-operator identity)"
    )
    retry.add_argument("seq", type=_positive_int, nargs="*", metavar="SEQ", help="dead letters' sequences")
    retry.add_argument("--all", action="store_true", help="every dead letter")
    for p in dlq_sub.choices.values():
        _nats_client(p)

    keys = sub.add_parser("keys", help="the stages' message-signing keys: make, rotate, retire")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="COMMAND")
    keys_sub.add_parser("init", help="a signing key for the watcher and the planner, and the keyrings trusting them")
    rot = keys_sub.add_parser("rotate", help="trust a new key for STAGE, then sign with it (the old stays trusted)")
    rot.add_argument("stage", choices=SIGNING_STAGES, help="the stage whose key is rotated")
    ret = keys_sub.add_parser("retire", help="stop trusting an old key of STAGE")
    ret.add_argument("stage", choices=SIGNING_STAGES, help="the stage whose old key is retired")
    ret.add_argument("key_id", metavar="KEY_ID", help="the key to stop trusting (keys list)")
    keys_list = keys_sub.add_parser("list", help="the key each stage signs with, and the keys trusted")
    _output_format(keys_list, "text", "json", "yaml")
    for p in keys_sub.choices.values():
        p.add_argument(
            "--dir",
            type=Path,
            default=Path(".tjpipe/keys"),
            help="key folder: each stage's signing key (0600), trusted-events/ and trusted-plans/ (*.pub) "
            "(default: .tjpipe/keys)",
        )

    history_server = sub.add_parser(
        "history-server",
        help="serve the event history as a web UI and a JSON API, each namespace to those the cluster lets read it",
    )
    add_settings(history_server, HistoryServerSettings)

    comp = sub.add_parser(
        "completion",
        help="print a shell completion script: bash, zsh or fish",
        description="Print a completion script for tjpipe. bash: source <(tjpipe completion bash); "
        "zsh: source <(tjpipe completion zsh); fish: tjpipe completion fish | source",
    )
    comp.add_argument("shell", choices=("bash", "zsh", "fish"), help="the shell to complete in")


def _debug_flag_everywhere(parser: argparse.ArgumentParser) -> None:
    """``--debug`` after the command too (``tjpipe history x --debug``), as kubectl takes global flags anywhere."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if not any("--debug" in a.option_strings for a in sub._actions):
                    sub.add_argument(
                        "--debug",
                        action="store_true",
                        default=argparse.SUPPRESS,
                        help="print a traceback with an error",
                    )
                _debug_flag_everywhere(sub)


def _debug_wanted(argv: list[str] | None) -> bool:
    words = sys.argv[1:] if argv is None else argv
    return "--debug" in words or os.environ.get("TJPIPE_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def _error(message: str) -> None:
    """One line on stderr, the text exactly as given (no markup)."""
    line = " ".join(message.split())
    sys.stderr.write(f"error: {line}\n")
    sys.stderr.flush()


_SERVICES = ("watcher", "planner", "applier", "controller", "webhook", "status-server")


def main(argv: list[str] | None = None) -> int:
    """Parse, run one command, and turn every error into one ``error: ...`` line and a documented exit code.

    Tracebacks are for bugs: they are printed with ``--debug`` or ``TJPIPE_DEBUG=1``, and always when a
    long-running service crashes (its log is where it is read).
    """
    import traceback

    from tjpipe.exits import CliError, ExitCode

    debug = _debug_wanted(argv)
    command = ""
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        command = args.command
        args.debug = debug
        settings.resolve(args, os.environ)
        return _dispatch(args)
    except CliError as exc:
        if debug:
            traceback.print_exc()
        _error(str(exc))
        return int(exc.code)
    except settings.SettingsError as exc:
        if debug:
            traceback.print_exc()
        _error(str(exc))
        return int(ExitCode.USAGE)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return int(ExitCode.INTERRUPTED)
    except BrokenPipeError:
        # The reader of stdout went away (| head): say nothing more, and let no flush at exit complain.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return int(ExitCode.FAILED)
    except Exception as exc:
        if debug or command in _SERVICES:
            traceback.print_exc()
        hint = "" if debug else " (run with --debug or TJPIPE_DEBUG=1 for a traceback)"
        _error(f"{type(exc).__name__}: {exc}{hint}")
        return int(ExitCode.FAILED)


def _dispatch(args: argparse.Namespace) -> int:
    command: str = args.command
    if command in _SERVICES:
        return _run_service(command, args)
    if command == "up":
        return _up(args)
    if command == "down":
        return _down(args)
    if command == "demo":
        return _demo(args)
    if command == "keys":
        return _keys(args)
    if command == "completion":
        from tjpipe.completion import script

        sys.stdout.write(script(build_parser(), args.shell))
        return 0
    if command == "bus-setup":
        return asyncio.run(_bus_setup(args))
    if command == "nats-credentials":
        return _nats_credentials(args)
    if command == "history-server":
        from history_server.server import run

        return run(settings.history_server(args))
    if command == "fleet":
        from tjpipe.fleet_command import run_fleet

        return run_fleet(args)
    if command == "nats-tls":
        from tjpipe.credentials import write_self_signed_tls

        written = write_self_signed_tls(args.dir, args.host)
        hosts = ", ".join(args.host)
        console.print(f"NATS TLS: {', '.join(str(p) for p in written.values())} for {hosts}", markup=False, emoji=False)
        return 0
    from tjpipe import operator_commands

    return operator_commands.run(command, args)


# ------------------------------------------------------------------------------------------- services


def _run_service(command: str, args: argparse.Namespace) -> int:
    from plumbing.bus import CredentialsError, NotAuthorized
    from plumbing.signing import KeyMaterialError
    from tjpipe.exits import UsageError

    try:
        return _start_service(command, args)
    except (KeyMaterialError, CredentialsError, NotAuthorized) as exc:  # no keys, no service: main says why
        raise UsageError(str(exc)) from exc


def _start_service(command: str, args: argparse.Namespace) -> int:
    """Every service starts the same way: its settings from the parsed arguments, then ``run_service``."""
    from plumbing.runner import run_service

    if command == "watcher":
        from watcher.service import run_watcher

        return run_service(settings.watcher(args), run_watcher)
    if command == "planner":
        from planner.service import run_planner

        return run_service(settings.planner(args), run_planner)
    if command == "applier":
        from applier.service import run_applier

        return run_service(settings.applier(args), run_applier)
    if command == "controller":
        return _run_controller(args)
    if command == "status-server":
        from status_server.server import run_status_server

        return run_service(settings.status_server(args), run_status_server)
    from planner.webhook import run_webhook

    return run_service(settings.webhook(args), run_webhook)


def _run_controller(args: argparse.Namespace) -> int:
    """The three stages in one process: each gets its settings as its own command would from these flags."""
    from applier.service import run_applier
    from planner.service import run_planner
    from plumbing.runner import run_stages
    from watcher.service import run_watcher

    settings.require_own_identities(args, STAGES)
    watcher, planner, applier = (settings.stage(args, stage) for stage in STAGES)
    ws, ps, aps = settings.watcher(watcher), settings.planner(planner), settings.applier(applier)
    return run_stages(
        settings.process(args),
        {
            "watcher": lambda stop: run_watcher(ws, stop),
            "planner": lambda stop: run_planner(ps, stop),
            "applier": lambda stop: run_applier(aps, stop),
        },
        service="controller",
    )


# ------------------------------------------------------------------------------------------- the bus


def _stream_settings(environ: Mapping[str, str]) -> tuple[tuple[StreamSpec, ...], int]:
    """The streams with the retention and replicas ``environ`` sets, for ``bus-setup``."""
    from contracts import streams

    try:
        return streams.configured_streams(environ), streams.stream_replicas(environ)
    except ValueError as exc:
        raise SettingsError(f"stream settings (TJPIPE_STREAM_REPLICAS, TJPIPE_<STREAM>_MAX_*): {exc}") from None


def _bucket_settings(environ: Mapping[str, str]) -> tuple[BucketSpec, ...]:
    """The object store buckets with the limits ``environ`` sets (``TJPIPE_LOGS_MAX_AGE``, ``..._MAX_BYTES``)."""
    from contracts import streams

    try:
        return streams.configured_buckets(environ)
    except ValueError as exc:
        raise SettingsError(f"bucket settings (TJPIPE_LOGS_MAX_*): {exc}") from None


async def _bus_setup(args: argparse.Namespace) -> int:
    from plumbing import bus_setup
    from tjpipe.nats_connection import connect_nats
    from tjpipe.operator_commands import route_logs

    # Like the operator commands: a refused identity or no NATS within --connect-timeout is one error line,
    # and the NATS client's warnings (a disconnect at close) show only with --debug.
    route_logs(debug=args.debug)
    nc = await connect_nats(args, "bus-setup")
    try:
        specs, replicas = args.bus
        await bus_setup.setup_bus(nc.jetstream(), specs, replicas=replicas, buckets=_bucket_settings(os.environ))
    finally:
        await nc.close()
    console.print("bus set up: streams, per-partition consumers, KV buckets")
    return 0


def _nats_credentials_flags(parser: argparse.ArgumentParser, default: Any) -> None:
    """``--dir`` and ``--authorization``, before or after ``rotate STEP`` (a suppressed default keeps either)."""
    parser.add_argument("--dir", type=Path, default=default, help="folder of <identity>.nk (0700, files 0600)")
    parser.add_argument(
        "--authorization", type=Path, default=default, help="write the nats-server authorization block here"
    )


def _nats_credentials(args: argparse.Namespace) -> int:
    from tjpipe import credentials
    from tjpipe.exits import Failure, UsageError

    if getattr(args, "dir", None) is None:
        raise UsageError("--dir is required")
    if getattr(args, "creds_command", None) == "rotate":
        if not credentials.Credentials(args.dir).exists():
            raise UsageError(f"{args.dir} does not hold a seed for every identity; run without 'rotate' first")
        try:
            credentials.rotation_step(
                args.step,
                credentials.Credentials(args.dir),
                authorization=getattr(args, "authorization", None),
                reload=args.reload,
                monitor=args.monitor,
                identities=args.identity or credentials.IDENTITIES,
                wait=args.wait,
                say=lambda line: print(line, flush=True),
            )
        except (credentials.RotationError, ValueError, OSError, TimeoutError) as exc:
            raise Failure(str(exc)) from exc
        return 0
    creds = credentials.generate_credentials(args.dir, replace=args.rotate)
    console.print(f"NATS identities in {creds.root}: {', '.join(credentials.IDENTITIES)}", markup=False, emoji=False)
    if getattr(args, "authorization", None):
        credentials.write_authorization(creds, args.authorization)
        console.print(f"authorization block (public keys only): {args.authorization}", markup=False, emoji=False)
    return 0


# ------------------------------------------------------------------------------------------- up / down


def _up(args: argparse.Namespace) -> int:
    from tjpipe.demo import follow_stack, results_position
    from tjpipe.exits import Failure, UsageError
    from tjpipe.local.realnode import NodeUnavailable
    from tjpipe.local.stack import Stack, StatePaths, choose_backends
    from tjpipe.local.toolchain import ToolchainMissing

    paths = StatePaths(args.state_dir.resolve())
    if args.real_node and (args.control_plane_only or args.kubeconfig or args.use_env):
        raise UsageError(
            "--real-node needs the stack's own cluster: not with --control-plane-only, --kubeconfig or --use-env"
        )
    if args.real_node:
        from tjpipe.local.realnode import preflight

        try:
            preflight()  # before anything starts: where this machine cannot run a node, one sentence and no process
        except NodeUnavailable as exc:
            _plain(str(exc), style="red")
            return 2
    if any(paths.logs.glob("*.pid")):
        raise Failure(f"a stack seems to be running already ({paths.logs}); run 'tjpipe down' first")
    try:
        backends = choose_backends(nats_url=args.nats_url, kubeconfig=args.kubeconfig, use_env=args.use_env)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    _announce(backends)
    stack = Stack(
        paths=paths,
        progress=lambda line: console.print(f"[dim]·[/] {escape(line)}"),
        simulate=not args.control_plane_only,
        sim_nodes=args.nodes,
        pod_run_seconds=args.pod_run_seconds if args.pod_run_seconds is not None else (20.0 if args.demo else 5.0),
        one_process=args.one_process,
        real_node=args.real_node,
    )
    # `timeout`, a service manager or a closing terminal send SIGTERM: stop everything as Ctrl-C does. A shell
    # starts background jobs with SIGINT ignored; `kill -INT` must stop the stack all the same.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        stack.start_infrastructure(
            nats_url=backends.nats_url, kubeconfig=backends.cluster.kubeconfig if backends.cluster else None
        )
        if stack.local_kube is not None:
            # Before the planner, which tells the trainer pods where it is: on loopback, which only a cluster
            # whose pods do not run (the stack's own) can use. An adopted cluster keeps TrainJobStatus off.
            stack.start_status_server()
        stack.start_services()
        stack.start_webhook()
        stack.start_history_server()
        since = asyncio.run(results_position(stack))  # the demo shows this run's results, not the history's
        demo = stack.create_demo() if args.demo else None
        # On the simulated cluster a second, MPI TrainJob shows a Secret and more ConfigMaps being cleaned up.
        more_demos = [stack.create_mpi_demo()] if demo and stack.simulation is not None and not args.real_node else []
        _where(stack)
        if args.detach:
            console.print("[green]stack running in the background[/]; stop it with [bold]tjpipe down[/]")
            stack.services.clear()  # detached: leave every process to 'tjpipe down'
            stack.local_kube = None
            stack.simulation = None
            stack.node = None
            stack.local_nats = None
            stack.webhook_url = ""  # keep its configuration: the webhook keeps running
            stack.history_url = ""
            return 0
        console.print("[green]stack running[/]; press [bold]Ctrl-C[/] to stop everything")
        asyncio.run(follow_stack(stack, demo, more_demos, console=console, sigterm_handler=_interrupt, since_seq=since))
    except (ToolchainMissing, NodeUnavailable) as exc:
        _plain(str(exc), style="red")
        return 2
    except KeyboardInterrupt:
        console.print("\nstopping…")
    finally:
        stack.stop()
    console.print("stopped; no process left running")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from tjpipe import demo
    from tjpipe.exits import Failure, UsageError
    from tjpipe.local.stack import demo_trainjob, mpi_demo_trainjob

    if not args.kubeconfig:
        raise UsageError("name the cluster: --kubeconfig PATH or KUBECONFIG")
    kubeconfig = Path(args.kubeconfig)
    demo.wait_until_admitting(kubeconfig, timeout=args.timeout, say=_say)
    trainjobs = demo.create_trainjobs(kubeconfig, [demo_trainjob(), mpi_demo_trainjob()], field_manager="tjpipe-demo")
    for namespace, name in trainjobs:
        _plain(f"created TrainJob {namespace}/{name}")
    if not demo.follow(kubeconfig, trainjobs, say=_say, timeout=args.timeout):
        raise Failure(f"the demo TrainJobs did not finish and get cleaned up within {args.timeout:.0f}s")
    console.print(
        "[bold green]demo finished[/]: the TrainJobs ran to Complete and the garbage collector removed everything "
        "they owned"
    )
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _announce(backends: Any) -> None:
    """Say where ``tjpipe up`` will write, before it writes anything: loudly when that is an existing server."""
    adopted = backends.nats_url or backends.cluster
    style = "bold yellow" if adopted else "bold"
    console.print(f"[{style}]tjpipe up writes to:[/]")
    for line in backends.describe():
        console.print(f"  [{style}]{escape(line)}[/]")
    ignored = [name for name in ("KUBECONFIG", "NATS_URL") if os.environ.get(name)]
    if not adopted and ignored:
        console.print(
            f"  ({' and '.join(ignored)} from the environment {'are' if len(ignored) > 1 else 'is'} not used; "
            "adopt existing servers with --kubeconfig PATH, --nats-url URL or --use-env)"
        )


def _plain(text: str, *, style: str | None = None) -> None:
    """A line of ``tjpipe up`` whose text holds paths, URLs or cluster data: printed as is, never as markup."""
    console.print(text, style=style, markup=False, emoji=False)


def _where(stack: Any) -> None:
    paths = stack.paths
    _plain(f"state folder: {paths.root}")
    if stack.local_kube is not None:
        _plain(f"  kubeconfig: {paths.kubeconfig}")
    elif stack.kubeconfig is not None:
        _plain(f"  kubeconfig: {stack.kubeconfig}   (an EXISTING cluster)")
    _plain(f"  NATS:       {stack.nats_url}" + ("   (an EXISTING server)" if stack.nats_adopted else ""))
    _plain(f"  env:        {paths.env_file}   (source it: . {paths.env_file})")
    if getattr(stack, "credentials", None) is not None:
        _plain(
            f"  NATS ids:   {stack.credentials.root}   (the env file picks reader.nk; dlq retry needs dlq-operator.nk)"
        )
    _plain(f"  logs, pids: {paths.logs}")
    if getattr(stack, "history_url", ""):
        _plain(f"history UI:   {stack.history_url}   (the event history in a browser; JSON API under /api/v1)")
        if stack.login_token:
            _plain(f"  log in with the stack's admin token: {stack.login_token}")
        else:
            _plain("  log in with a token of the cluster, e.g. kubectl create token NAME -n NAMESPACE")


def _down(args: argparse.Namespace) -> int:
    from tjpipe.exits import UsageError
    from tjpipe.local.stack import StatePaths, purge_state, stop_detached

    paths = StatePaths(args.state_dir.resolve())
    if args.purge and paths.root.exists() and not paths.root.is_dir():
        raise UsageError(f"{paths.root} is not a folder; not purging it")
    foreign = paths.foreign_entries() if args.purge else []
    if foreign:
        # Checked before anything is stopped: a mistyped --state-dir must never cost a user's files.
        raise UsageError(f"{paths.root} holds what the stack did not make ({', '.join(foreign)}); not purging it")
    stopped = stop_detached(paths)
    print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
    if args.purge:
        print(f"deleted the state folder {paths.root}" if purge_state(paths) else f"no state folder at {paths.root}")
    return 0


def _keys(args: argparse.Namespace) -> int:
    """Results go to stdout as plain text: key ids and paths are data, not markup."""
    from plumbing.signing import KeyMaterialError
    from tjpipe.exits import Failure
    from tjpipe.keys.signing import KeyFolder

    sub: str = args.keys_command
    folder = KeyFolder(args.dir.resolve())
    try:
        if sub == "init":
            folder.ensure()
            print(f"keys in {folder.root}: " + ", ".join(f"{s} {folder.current_key_id(s)}" for s in SIGNING_STAGES))
        elif sub == "rotate":
            old, new = folder.rotate(args.stage)
            print(
                f"{args.stage} now signs with {new} (running services pick it up within seconds); {old} is still "
                f"trusted for messages signed before. Once they are consumed: tjpipe keys retire {args.stage} {old}"
            )
        elif sub == "retire":
            removed = folder.retire(args.stage, args.key_id)
            print(f"{args.stage} key {args.key_id} is no longer trusted (removed {removed})")
        elif args.output != "text":
            from tjpipe.operator_commands import emit

            rows = [
                {"stage": s, "signs_with": folder.current_key_id(s), "trusted": list(folder.trusted_key_ids(s))}
                for s in SIGNING_STAGES
            ]
            emit(rows, args.output)
        else:
            for stage in SIGNING_STAGES:
                trusted = ", ".join(folder.trusted_key_ids(stage))
                print(f"{stage}: signs with {folder.current_key_id(stage)}; trusted: {trusted}")
    except (KeyMaterialError, ValueError, OSError) as exc:
        raise Failure(str(exc)) from exc
    return 0


def _say(line: str) -> None:
    """Markup written by ``tjpipe up`` itself, its data escaped by the caller; no emoji codes in cluster text."""
    console.print(line, emoji=False)


if __name__ == "__main__":
    sys.exit(main())

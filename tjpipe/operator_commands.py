"""The operator commands' terminal side: argument checks, tables, YAML and JSON, exit codes.

Kept apart from ``tjpipe.history_tools`` so that the logic is testable without a terminal and the output formats
can change without touching it.

Two rules keep the output trustworthy. Machine-readable output (``-o json|yaml``, ``plan``'s manifests) is
written to stdout as the serializer made it, never through rich, so it is byte for byte what a parser
expects. Human output goes through rich consoles with markup and emoji off, and styles are attached as
``Text`` styles, so user data such as a container command holding ``x = batch[i]`` or ``[/opt/x]`` is
printed as it is instead of being read as markup. Errors are raised as ``tjpipe.exits`` errors, which
``cli.main`` prints as one line with a documented exit code; nothing here prints a traceback or retries a
connection without bound.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import logging
import re
import sys
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import yaml
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from contracts.messages import ObjectApply, ObjectKey
from tjpipe.exits import ExitCode, Failure, Unreachable, UsageError
from tjpipe.nats_connection import connect_nats

if TYPE_CHECKING:
    from planner.framework import Framework
    from tjpipe.history_tools import StoredDeadLetter

out = Console(highlight=False, soft_wrap=True, markup=False, emoji=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False, emoji=False)


def run(command: str, args: argparse.Namespace) -> int:
    """Run one operator command; raises ``tjpipe.exits`` errors for ``cli.main`` to print."""
    route_logs(debug=bool(getattr(args, "debug", False)))
    if command == "plan":
        return _plan(args)
    _check_arguments(command, args)  # before connecting: a typo is not worth a timeout
    return asyncio.run(_with_bus(command, args))


def _check_arguments(command: str, args: argparse.Namespace) -> None:
    """Turn the NAME and ``--since`` arguments into a key and a time, or raise ``UsageError``."""
    args.key = None
    args.where = records_of(getattr(args, "cluster", None))
    if command == "history":
        args.key = trainjob_key(args.trainjob, args.namespace)
    elif command == "replay":
        if args.trainjob and args.all:
            raise UsageError("name one TrainJob or pass --all, not both")
        if not args.trainjob and not args.all:
            raise UsageError("name a TrainJob ([NAMESPACE/]NAME) or pass --all")
        if args.all and args.namespace:
            raise UsageError("--all replays every namespace; -n/--namespace goes with a NAME")
        args.key = trainjob_key(args.trainjob, args.namespace) if args.trainjob else None
        args.since_time = parse_since(args.since)
    elif command == "dlq" and args.dlq_command == "retry":
        if args.all and args.seq:
            raise UsageError("name dead letters by sequence or pass --all, not both")
        if not args.seq and not args.all:
            raise UsageError("name dead letters by sequence, or pass --all")


def route_logs(*, debug: bool) -> None:
    """The libraries' warnings (a NATS reconnect, a disconnect at close) are not the command's output: on
    stderr with ``--debug`` only. A connection that never comes up is still explained, by ``connect_nats``."""
    if debug:
        logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
    else:
        logging.getLogger().addHandler(logging.NullHandler())


def records_of(cluster: str | None) -> Any:
    """``--cluster``: that member cluster's records at the fleet's hub (``tjpipe.history_tools.Records``), checked
    as a cluster name, so it can only ever be one literal subject token; without it, the bus's own."""
    from contracts.fleet import FleetNameError, check_cluster_name
    from tjpipe.history_tools import LOCAL, Records

    if cluster is None:
        return LOCAL
    try:
        return Records(cluster=check_cluster_name(cluster))
    except FleetNameError as exc:
        raise UsageError(f"--cluster: {exc}") from None


async def _connect(args: argparse.Namespace, command: str) -> Any:
    """The bus, as ``fleet-reader`` when the records read are a fleet cluster's (its inbox is its own)."""
    if getattr(args, "where", None) is not None and args.where.cluster:
        from tjpipe.fleet_nats import HUB_READER

        return await connect_nats(args, command, identity=HUB_READER)
    return await connect_nats(args, command)


# ------------------------------------------------------------------------------------------ raw output


class _Dumper(yaml.SafeDumper):
    """YAML as kubectl prints it: multi-line strings (a function's source in a command) as literal blocks."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def to_yaml(value: Any) -> str:
    return yaml.dump(value, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1 << 30)


def to_yaml_all(values: list[Any]) -> str:
    return yaml.dump_all(values, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1 << 30)


def to_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str) + "\n"


def emit(value: Any, output: str) -> None:
    """Write ``value`` to stdout as JSON or YAML, exactly as serialized."""
    sys.stdout.write(to_json(value) if output == "json" else to_yaml(value))
    sys.stdout.flush()


# ------------------------------------------------------------------------------------------ arguments

_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_TRAINJOB_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def valid_namespace(text: str) -> bool:
    """A DNS-1123 label, as Kubernetes names a namespace; never a subject wildcard or a dot."""
    return bool(_NAMESPACE.fullmatch(text)) and len(text) <= 63


def trainjob_key(text: str, namespace: str | None) -> ObjectKey:
    """``NAMESPACE/NAME``, or ``NAME`` with ``-n NAMESPACE`` (default ``default``), as kubectl names objects.

    Both parts become NATS subject tokens, so they are checked against Kubernetes' rules (a namespace is a
    DNS-1123 label, a TrainJob name an RFC 1035 label): a wildcard or a dot can never widen a query.
    """
    ns, sep, name = text.rpartition("/")
    if not sep:
        ns = namespace or "default"
    elif namespace and namespace != ns:
        raise UsageError(f"{text!r} names namespace {ns!r} but --namespace says {namespace!r}")
    if not valid_namespace(ns):
        raise UsageError(
            f"invalid namespace {ns!r} in {text!r}: a namespace is at most 63 lowercase letters, digits "
            "and '-', starting and ending with a letter or digit (expected [NAMESPACE/]NAME)"
        )
    if not _TRAINJOB_NAME.fullmatch(name) or len(name) > 63:
        raise UsageError(
            f"invalid TrainJob name {name!r} in {text!r}: a name is at most 63 lowercase letters, digits and "
            "'-', starting with a letter and ending with a letter or digit (expected [NAMESPACE/]NAME)"
        )
    return ObjectKey(namespace=ns, name=name)


def parse_since(text: str | None, *, now: float | None = None) -> float | None:
    """``2h``, ``30m``, ``90s``, ``1d`` ago, or an ISO 8601 time (UTC unless it says otherwise)."""
    if not text:
        return None
    match = re.fullmatch(r"(\d+)([smhd])", text.strip())
    if match:
        seconds = int(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
        return (now if now is not None else dt.datetime.now(dt.UTC).timestamp()) - seconds
    try:
        parsed = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"invalid --since {text!r}: expected a duration such as 90s, 30m, 2h or 1d, "
            "or an ISO 8601 time such as 2026-01-31T12:00:00Z"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _short(value: Any) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False) if not isinstance(value, str) else value
    return text if len(text) <= 120 else text[:117] + "..."


async def _with_bus(command: str, args: argparse.Namespace) -> int:
    import nats.errors

    nc = await _connect(args, command)
    try:
        js = nc.jetstream()
        if command == "history":
            return await _history(js, args)
        if command == "replay":
            return await _replay(js, args)
        if command == "dlq":
            return await _dlq(js, args)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
        raise _unanswered_read(exc) from exc
    finally:
        await nc.close()
    raise AssertionError(command)


def _unanswered_read(exc: Exception) -> Failure:
    return Failure(
        f"NATS did not answer a read of the streams ({type(exc).__name__}): the identity in use may not "
        "read them, or the bus is not set up (tjpipe bus-setup)"
    )


# ---------------------------------------------------------------------------------------------- history


async def _history(js: Any, args: argparse.Namespace) -> int:
    from tjpipe import history_tools

    key: ObjectKey = args.key
    entries = await history_tools.history(js, key, where=args.where)
    where = f" in cluster {args.where.cluster}" if args.where.cluster else ""
    if not entries:
        raise Failure(f"no history for TrainJob {key}{where} (wrong name, or older than the streams keep)")
    if args.output != "table":
        rows = [
            {
                "time": _when(e.time),
                "stream": e.stream,
                "seq": e.seq,
                "kind": e.kind,
                "summary": e.summary,
                "detail": e.detail,
            }
            for e in entries
        ]
        emit(rows, args.output)
        return ExitCode.OK
    table = Table(title=f"history of TrainJob {key}{where}")
    for column in ("time (UTC)", "stream", "seq", "kind", "what"):
        table.add_column(column)
    colour = {"event": "cyan", "plan": "white", "result": "green", "dead-letter": "red", "progress": "magenta"}
    for e in entries if args.every_progress else history_tools.fold_progress(entries):
        what = e.summary
        if e.kind == "event" and e.detail.get("changed"):
            what += "\n  changed: " + ", ".join(e.detail["changed"][:8])
        seq = f"{e.seq}-{e.detail['last_seq']}" if e.kind == "progress" and "last_seq" in e.detail else str(e.seq)
        table.add_row(
            Text(_when(e.time)),
            Text(e.stream),
            Text(seq),
            Text(e.kind, style=colour.get(e.kind, "")),
            Text(what),
        )
    out.print(table)
    return ExitCode.OK


# ----------------------------------------------------------------------------------------------- replay


def _framework(args: argparse.Namespace) -> Framework:
    """The planner's plugins as the TrainJobStatus settings say (``.tjpipe/env`` sets them as the stack's planner
    runs), so a replay or a preview plans what the planner does."""
    from planner.service import framework_with
    from tjpipe.settings import status_server_of

    return framework_with(status_server_of(args))


async def _replay(js: Any, args: argparse.Namespace) -> int:
    from tjpipe import history_tools

    key: ObjectKey | None = args.key
    since: float | None = args.since_time
    framework = _framework(args)
    if args.all and sys.stderr.isatty():
        with Progress(console=err, transient=True) as bar:
            task = bar.add_task("replaying events", total=None)
            report = await history_tools.replay(
                js,
                key=None,
                since=since,
                from_seq=args.from_seq,
                framework=framework,
                progress=lambda: bar.advance(task),
                where=args.where,
            )
    else:
        report = await history_tools.replay(
            js, key=key, since=since, from_seq=args.from_seq, framework=framework, where=args.where
        )
    changed = [e for e in report.events if e.changed]
    if args.output != "table":
        emit(
            {
                "events": len(report.events),
                "jobs": len(report.jobs),
                "jobs_changed": sorted(report.changed_jobs),
                "fields_changed": report.changed_fields(),
                "changes": [
                    {
                        "trainjob": str(e.key),
                        "seq": e.seq,
                        "components": {
                            c: [{"field": p, "recorded": a, "replayed": b} for p, a, b in d]
                            for c, d in e.changed.items()
                        },
                    }
                    for e in changed
                ],
            },
            args.output,
        )
    else:
        for e in changed:
            out.print(Text.assemble((str(e.key), "bold"), f" event {e.seq}:"))
            for component, diffs in e.changed.items():
                for path, old, new in diffs:
                    out.print(_diff_line(f"  {component}: {path}: ", old, new))
        unchanged = len(report.jobs) - len(report.changed_jobs)
        out.print(
            f"replayed {len(report.events)} event(s) of {len(report.jobs)} TrainJob(s): "
            f"{unchanged} unchanged, {len(report.changed_jobs)} changed"
        )
        fields = report.changed_fields()
        if fields:
            out.print("fields changed: " + ", ".join(f"{f} ({n})" for f, n in sorted(fields.items())))
    return ExitCode.DIFFERENCES if changed else ExitCode.OK


def _diff_line(prefix: str, old: Any, new: Any) -> Text:
    return Text.assemble(prefix, (_short(old), "red"), " → ", (_short(new), "green"))


# ------------------------------------------------------------------------------------------------ plan


def _load_yaml(path: str, flag: str) -> list[dict[str, Any]]:
    """The YAML documents in ``path`` (``-`` is stdin); a missing file or bad YAML is a usage error."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except FileNotFoundError:
        raise UsageError(f"{flag} {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{flag} {path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    where = "stdin" if path == "-" else path
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise UsageError(f"{where}: not valid YAML{at}: {problem}") from None
    not_objects = [d for d in docs if d is not None and not isinstance(d, dict)]
    if not_objects:
        raise UsageError(f"{where}: every YAML document must be a Kubernetes object (a mapping)")
    return [d for d in docs if d]


_RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")


def _recorded_trainjob(args: argparse.Namespace) -> list[Any]:
    """``plan --from-history``: what today's planner makes of the TrainJob's newest recorded observation."""
    from planner.core import plan

    if args.runtime or args.from_cluster:
        raise UsageError("--from-history plans the runtime recorded with the TrainJob: no --runtime or --from-cluster")
    key = trainjob_key(args.from_history, args.namespace)
    args.where = records_of(args.cluster)
    framework = _framework(args)

    async def read() -> Any:
        import nats.errors

        from tjpipe import history_tools

        nc = await _connect(args, "plan")
        try:
            return await history_tools.recorded_observation(nc.jetstream(), key, where=args.where)
        except LookupError:
            where = f" in cluster {args.cluster}" if args.cluster else ""
            raise Failure(
                f"no recorded observation of TrainJob {key}{where} (wrong name, or older than the streams keep)"
            ) from None
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
            raise _unanswered_read(exc) from exc
        finally:
            await nc.close()

    event = asyncio.run(read())
    return list(plan(event, source_seq=0, framework=framework).applies)


def _plan(args: argparse.Namespace) -> int:
    from tjpipe import history_tools

    if args.cluster and not args.from_history:
        raise UsageError("--cluster names the member cluster whose history --from-history reads")
    if args.from_history:
        output = args.output or ("table" if args.server_dry_run else "yaml")
        if output == "table" and not args.server_dry_run:
            raise UsageError("-o table shows a --server-dry-run diff; plan prints objects as yaml or json")
        recorded = _recorded_trainjob(args)
        if not args.server_dry_run:
            objects = [msgspec.to_builtins(m.object) for m in recorded if isinstance(m, ObjectApply)]
            sys.stdout.write(to_json(objects) if output == "json" else to_yaml_all(objects))
            return ExitCode.OK
        return _ClusterReader.connect(args).dry_run_diff(recorded, output)
    if args.file == "-" and args.runtime == "-":
        raise UsageError("only one of -f and --runtime can read stdin")
    docs = _load_yaml(args.file, "-f")
    where = "stdin" if args.file == "-" else args.file
    trainjobs = [d for d in docs if d.get("kind") == "TrainJob"]
    if len(trainjobs) != 1:
        raise UsageError(f"{where} must hold exactly one TrainJob (found {len(trainjobs)})")
    trainjob = dict(trainjobs[0])
    metadata = dict(trainjob.get("metadata") or {})
    if not isinstance(metadata.get("name"), str) or not metadata["name"]:
        raise UsageError(f"{where}: the TrainJob has no metadata.name")
    if args.namespace:
        if metadata.get("namespace") not in (None, "", args.namespace):
            raise UsageError(
                f"the TrainJob's namespace {metadata['namespace']!r} does not match --namespace {args.namespace!r}"
            )
        metadata["namespace"] = args.namespace
        trainjob["metadata"] = metadata
    runtime = next((d for d in docs if d.get("kind") in _RUNTIME_KINDS), None)
    if args.runtime:
        runtime = next((d for d in _load_yaml(args.runtime, "--runtime") if d.get("kind") in _RUNTIME_KINDS), None)
        if runtime is None:
            raise UsageError(f"--runtime {args.runtime}: no TrainingRuntime or ClusterTrainingRuntime in it")
    output = args.output or ("table" if args.server_dry_run else "yaml")
    if output == "table" and not args.server_dry_run:
        raise UsageError("-o table shows a --server-dry-run diff; plan prints objects as yaml or json")
    reader = _ClusterReader.connect(args) if (args.from_cluster or args.server_dry_run) else None
    if args.from_cluster:
        assert reader is not None
        runtime = reader.runtime_for(trainjob)
        if runtime is None:
            ref = trainjob.get("spec", {}).get("runtimeRef", {})
            raise Failure(
                f"{ref.get('kind', 'ClusterTrainingRuntime')} {ref.get('name', '')!r} (spec.runtimeRef) "
                "is not in the cluster"
            )
    try:
        messages = history_tools.preview(trainjob, runtime, framework=_framework(args))
    except msgspec.ValidationError as exc:
        raise UsageError(f"{where}: not a valid TrainJob or runtime: {exc}") from None
    if reader is None or not args.server_dry_run:
        objects = [msgspec.to_builtins(m.object) for m in messages if isinstance(m, ObjectApply)]
        sys.stdout.write(to_json(objects) if output == "json" else to_yaml_all(objects))
        return ExitCode.OK
    return reader.dry_run_diff(messages, output)


class _ClusterReader:
    """The cluster side of ``plan``: the runtime a TrainJob names, and ``dryRun=All`` applies to diff."""

    def __init__(self, api: Any, server: str, timeout: float) -> None:
        from kubernetes import dynamic

        self.server = server
        self.timeout = timeout
        self.dyn = self._call(lambda: dynamic.DynamicClient(api))  # type: ignore[no-untyped-call]

    @classmethod
    def connect(cls, args: argparse.Namespace) -> _ClusterReader:
        """A client for the kubeconfig (and ``--context``) named, once the apiserver has answered."""
        from kubernetes import client as kube_client
        from kubernetes import config as kube_config
        from kubernetes.config.config_exception import ConfigException

        path = args.kubeconfig or None
        default = Path.home() / ".kube" / "config"
        if path is None and not default.exists():
            raise UsageError("--from-cluster and --server-dry-run need a kubeconfig: --kubeconfig or KUBECONFIG")
        configuration = kube_client.Configuration()
        try:
            kube_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path or str(default),
                context=getattr(args, "context", None) or None,
                client_configuration=configuration,
            )
        except ConfigException as exc:
            raise UsageError(f"kubeconfig {path or default}: {exc}") from None
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"kubeconfig {path or default}: cannot read it: {exc}") from None
        configuration.retries = 0  # urllib3 would retry a refused connection; --connect-timeout is the bound
        api = kube_client.ApiClient(configuration)
        server, timeout = str(configuration.host), float(args.connect_timeout)
        # Discovery (in __init__) has no timeout of its own: ask for /version within the bound first.
        _kube_call(server, lambda: kube_client.VersionApi(api).get_code(_request_timeout=(timeout, timeout)))
        return cls(api, server, timeout)

    def _call(self, call: Any) -> Any:
        return _kube_call(self.server, call)

    def _get(self, api_version: str, kind: str, name: str, namespace: str | None) -> dict[str, Any] | None:
        from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError

        def get() -> dict[str, Any] | None:
            try:
                res = self.dyn.resources.get(api_version=api_version, kind=kind)
                obj: dict[str, Any] = res.get(
                    name=name, namespace=namespace, _request_timeout=(self.timeout, 60)
                ).to_dict()
            except NotFoundError:
                return None
            except ResourceNotFoundError:
                raise Failure(f"the apiserver at {self.server} does not serve {kind} ({api_version})") from None
            return obj

        result: dict[str, Any] | None = self._call(get)
        return result

    def runtime_for(self, trainjob: dict[str, Any]) -> dict[str, Any] | None:
        ref = trainjob.get("spec", {}).get("runtimeRef", {})
        kind = ref.get("kind", "ClusterTrainingRuntime")
        namespace = (trainjob.get("metadata") or {}).get("namespace") or "default"
        return self._get(
            "trainer.kubeflow.org/v1alpha1",
            kind,
            ref.get("name", ""),
            namespace if kind == "TrainingRuntime" else None,
        )

    def dry_run_diff(self, messages: list[Any], output: str) -> int:
        from kubernetes.dynamic.exceptions import ResourceNotFoundError

        from tjpipe import history_tools

        rows: list[dict[str, Any]] = []
        for message in messages:
            if not isinstance(message, ObjectApply):
                continue
            target = message.target
            if target.subresource:
                rows.append({"target": str(target), "result": "skipped", "changes": []})
                continue

            def apply(message: Any = message, target: Any = target) -> dict[str, Any]:
                try:
                    res = self.dyn.resources.get(api_version=target.api_version, kind=target.kind)
                except ResourceNotFoundError:
                    raise Failure(
                        f"the apiserver at {self.server} does not serve {target.kind} ({target.api_version})"
                    ) from None
                applied: dict[str, Any] = self.dyn.server_side_apply(
                    res,
                    body=msgspec.to_builtins(message.object),
                    namespace=target.namespace,
                    field_manager=message.field_manager,
                    force_conflicts=True,
                    dry_run="All",
                    _request_timeout=(self.timeout, 60),
                ).to_dict()
                return applied

            live = self._get(target.api_version, target.kind, target.name, target.namespace)
            applied = self._call(apply)
            diffs = [
                d
                for d in history_tools.field_diff(_strip(live), _strip(applied))
                if not d[0].startswith("metadata.managedFields")
            ]
            result = "created" if live is None else ("changed" if diffs else "unchanged")
            rows.append(
                {
                    "target": str(target),
                    "result": result,
                    "changes": [] if live is None else [{"field": p, "live": a, "dryRun": b} for p, a, b in diffs],
                }
            )
        if output in ("json", "yaml"):
            emit(rows, output)
        else:
            for row in rows:
                if row["result"] == "skipped":
                    out.print(f"{row['target']}: status is computed from the live objects; not dry-run")
                elif row["result"] == "created":
                    out.print(Text(f"{row['target']}: would be created", style="green"))
                elif row["result"] == "changed":
                    out.print(Text(f"{row['target']}: would change", style="yellow"))
                    for change in row["changes"]:
                        out.print(_diff_line(f"  {change['field']}: ", change["live"], change["dryRun"]))
                else:
                    out.print(f"{row['target']}: unchanged")
        differ = any(row["result"] in ("created", "changed") for row in rows)
        return ExitCode.DIFFERENCES if differ else ExitCode.OK


def _kube_call(server: str, call: Any) -> Any:
    """Run one client call, turning transport errors into ``Unreachable`` and refusals into ``Failure``."""
    import urllib3.exceptions
    from kubernetes.client.exceptions import ApiException
    from kubernetes.dynamic.exceptions import DynamicApiError

    try:
        return call()
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise Unreachable(f"cannot reach the apiserver at {server}: {reason}") from exc
    except DynamicApiError as exc:
        raise Failure(f"the apiserver at {server} refused: {exc.status} {_api_message(exc)}") from exc
    except ApiException as exc:
        raise Failure(f"the apiserver at {server} refused: {exc.status} {exc.reason}") from exc


def _api_message(exc: Any) -> str:
    try:
        body = json.loads(exc.body)
    except (TypeError, ValueError):
        return str(exc.reason or "")
    return str(body.get("message") or exc.reason or "") if isinstance(body, dict) else str(exc.reason or "")


def _strip(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    if obj is None:
        return None
    clean = dict(obj)
    meta = dict(clean.get("metadata", {}))
    for volatile in ("resourceVersion", "generation", "managedFields", "creationTimestamp", "uid"):
        meta.pop(volatile, None)
    clean["metadata"] = meta
    clean.pop("status", None)
    return clean


# ------------------------------------------------------------------------------------------------- dlq


def _letter_row(item: StoredDeadLetter, *, decode_payload: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"seq": item.seq, "time": _when(item.time), **msgspec.to_builtins(item.letter)}
    payload: bytes = item.letter.payload
    row["payload"] = payload.decode(errors="replace")
    if decode_payload:
        with suppress(ValueError):
            row["payload"] = json.loads(payload)
    return row


async def _dlq(js: Any, args: argparse.Namespace) -> int:
    from tjpipe import history_tools

    letters = await history_tools.dead_letters(js)
    if args.dlq_command == "list":
        if args.output != "table":
            emit([_letter_row(i, decode_payload=False) for i in letters], args.output)
            return ExitCode.OK
        table = Table(title=f"{len(letters)} dead letter(s)")
        for column in ("seq", "time (UTC)", "stage", "reason", "subject", "error"):
            table.add_column(column)
        for item in letters:
            letter = item.letter
            table.add_row(
                *(
                    Text(cell)
                    for cell in (
                        str(item.seq),
                        _when(item.time),
                        letter.stage,
                        letter.reason,
                        letter.subject,
                        _short(letter.error),
                    )
                )
            )
        out.print(table)
        return ExitCode.OK
    if args.dlq_command == "show":
        match = next((i for i in letters if i.seq == args.seq), None)
        if match is None:
            raise Failure(f"no dead letter with sequence {args.seq}")
        shown = _letter_row(match, decode_payload=True)
        emit(shown, args.output)
        return ExitCode.OK
    seqs = [i.seq for i in letters] if args.all else list(args.seq)
    import nats.errors

    known = {i.seq for i in letters}
    for seq in seqs:
        if seq not in known:
            raise Failure(f"no dead letter with sequence {seq}")
        try:
            subject = await history_tools.retry_dead_letter(js, seq)
        except (nats.errors.TimeoutError, TimeoutError):
            # NATS never answers a request its permissions refuse; the silence is the refusal.
            raise Failure(
                f"no answer for dead letter {seq}: the NATS identity in use may not resend dead letters "
                "(use the dlq-operator identity, e.g. NATS_CREDS=.tjpipe/creds/dlq-operator.nk)"
            ) from None
        sys.stdout.write(f"dead letter {seq} sent back to {subject}\n")
    if not seqs:
        sys.stdout.write("no dead letters\n")
    return ExitCode.OK

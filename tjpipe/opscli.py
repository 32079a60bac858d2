"""The operator commands' terminal side: argument handling, tables, YAML and JSON, exit codes.

Kept apart from ``tjpipe.ops`` so that the logic is testable without a terminal and the output formats
can change without touching it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import re
import sys
from typing import Any

import msgspec
import yaml
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from tjpipe import ops
from tjpipe.contracts.messages import ObjectApply, ObjectKey

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def run(command: str, args: argparse.Namespace) -> int:
    from tjpipe.plumbing.bus import CredentialsError, NotAuthorized

    if command == "plan":
        return _plan(args)
    try:
        return asyncio.run(_with_bus(command, args))
    except (CredentialsError, NotAuthorized) as exc:
        err.print(f"[red]tjpipe {command}: {exc}[/] (set NATS_CREDS, e.g. from .tjpipe/env)")
        return 2


async def _with_bus(command: str, args: argparse.Namespace) -> int:
    from tjpipe.cli import nats_options
    from tjpipe.plumbing import bus

    nc = await bus.connect(args.nats_url, name=f"tjpipe-{command}", **nats_options(args))
    try:
        js = nc.jetstream()
        if command == "history":
            return await _history(js, args)
        if command == "replay":
            return await _replay(js, args)
        if command == "dlq":
            return await _dlq(js, args)
    finally:
        await nc.close()
    raise AssertionError(command)


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def parse_since(text: str | None, *, now: float | None = None) -> float | None:
    """``2h``, ``30m``, ``90s``, ``1d`` ago, or an ISO 8601 time."""
    if not text:
        return None
    match = re.fullmatch(r"(\d+)([smhd])", text)
    if match:
        seconds = int(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
        return (now if now is not None else dt.datetime.now(dt.UTC).timestamp()) - seconds
    parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


# ---------------------------------------------------------------------------------------------- history


async def _history(js: Any, args: argparse.Namespace) -> int:
    key = ObjectKey.parse(args.trainjob)
    entries = await ops.history(js, key)
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
        out.print(json.dumps(rows, indent=2) if args.output == "json" else yaml.safe_dump(rows, sort_keys=False))
        return 0
    if not entries:
        err.print(f"no history for {key} (wrong name, or older than the streams keep)")
        return 1
    table = Table(title=f"history of TrainJob {key}")
    for column in ("time (UTC)", "stream", "seq", "kind", "what"):
        table.add_column(column)
    colour = {"event": "cyan", "plan": "white", "result": "green", "dead-letter": "red"}
    for e in entries:
        what = e.summary
        if e.kind == "event" and e.detail.get("changed"):
            what += "\n  changed: " + ", ".join(e.detail["changed"][:8])
        table.add_row(_when(e.time), e.stream, str(e.seq), f"[{colour.get(e.kind, 'white')}]{e.kind}[/]", what)
    out.print(table)
    return 0


# ----------------------------------------------------------------------------------------------- replay


async def _replay(js: Any, args: argparse.Namespace) -> int:
    if bool(args.trainjob) == bool(args.all):
        err.print("name one TrainJob (NAMESPACE/NAME) or pass --all")
        return 2
    key = ObjectKey.parse(args.trainjob) if args.trainjob else None
    since = parse_since(args.since)
    if args.all and sys.stderr.isatty():
        with Progress(console=err, transient=True) as bar:
            task = bar.add_task("replaying events", total=None)
            report = await ops.replay(
                js, key=None, since=since, from_seq=args.from_seq, progress=lambda: bar.advance(task)
            )
    else:
        report = await ops.replay(js, key=key, since=since, from_seq=args.from_seq)
    changed = [e for e in report.events if e.changed]
    if args.output == "json":
        out.print(
            json.dumps(
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
                indent=2,
                default=str,
            )
        )
    else:
        for e in changed:
            out.print(f"[bold]{e.key}[/] event {e.seq}:")
            for component, diffs in e.changed.items():
                for path, old, new in diffs:
                    out.print(f"  {component}: {path}: [red]{_short(old)}[/] → [green]{_short(new)}[/]")
        unchanged = len(report.jobs) - len(report.changed_jobs)
        out.print(
            f"replayed {len(report.events)} event(s) of {len(report.jobs)} TrainJob(s): "
            f"{unchanged} unchanged, {len(report.changed_jobs)} changed"
        )
        fields = report.changed_fields()
        if fields:
            out.print("fields changed: " + ", ".join(f"{f} ({n})" for f, n in sorted(fields.items())))
    return 1 if changed else 0


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 120 else text[:117] + "..."


# ------------------------------------------------------------------------------------------------ plan


def _load_yaml(path: Any) -> list[dict[str, Any]]:
    with open(path) as handle:
        return [d for d in yaml.safe_load_all(handle) if d]


def _plan(args: argparse.Namespace) -> int:
    docs = _load_yaml(args.file)
    trainjobs = [d for d in docs if d.get("kind") == "TrainJob"]
    if len(trainjobs) != 1:
        err.print(f"{args.file} must hold exactly one TrainJob (found {len(trainjobs)})")
        return 2
    trainjob = trainjobs[0]
    runtime = next((d for d in docs if d.get("kind") in ("TrainingRuntime", "ClusterTrainingRuntime")), None)
    if args.runtime:
        runtime = next(
            (d for d in _load_yaml(args.runtime) if d.get("kind") in ("TrainingRuntime", "ClusterTrainingRuntime")),
            None,
        )
    client = None
    if args.from_cluster or args.server_dry_run:
        from tjpipe.local.kubeapi import new_api_client

        client = _ClusterReader(new_api_client(_kubeconfig(args)))
    if args.from_cluster:
        assert client is not None
        runtime = client.runtime_for(trainjob)
        if runtime is None:
            err.print("the runtime named by spec.runtimeRef is not in the cluster")
            return 1
    messages = ops.preview(trainjob, runtime)
    if not args.server_dry_run:
        objects = [msgspec.to_builtins(m.object) for m in messages if isinstance(m, ObjectApply)]
        out.print(yaml.safe_dump_all(objects, sort_keys=False), end="")
        return 0
    assert client is not None
    return client.dry_run_diff(messages)


def _kubeconfig(args: argparse.Namespace) -> Any:
    from pathlib import Path

    if not args.kubeconfig:
        err.print("--from-cluster and --server-dry-run need KUBECONFIG (or --kubeconfig)")
        raise SystemExit(2)
    return Path(args.kubeconfig)


class _ClusterReader:
    def __init__(self, api: Any) -> None:
        from kubernetes import dynamic

        self.dyn = dynamic.DynamicClient(api)  # type: ignore[no-untyped-call]

    def _get(self, api_version: str, kind: str, name: str, namespace: str | None) -> dict[str, Any] | None:
        from kubernetes.dynamic.exceptions import NotFoundError

        try:
            res = self.dyn.resources.get(api_version=api_version, kind=kind)
            obj: dict[str, Any] = res.get(name=name, namespace=namespace).to_dict()
        except NotFoundError:
            return None
        return obj

    def runtime_for(self, trainjob: dict[str, Any]) -> dict[str, Any] | None:
        ref = trainjob.get("spec", {}).get("runtimeRef", {})
        kind = ref.get("kind", "ClusterTrainingRuntime")
        namespace = trainjob.get("metadata", {}).get("namespace", "default") if kind == "TrainingRuntime" else None
        return self._get("trainer.kubeflow.org/v1alpha1", kind, ref.get("name", ""), namespace)

    def dry_run_diff(self, messages: list[Any]) -> int:
        differ = 0
        for message in messages:
            if not isinstance(message, ObjectApply):
                continue
            target = message.target
            res = self.dyn.resources.get(api_version=target.api_version, kind=target.kind)
            body = msgspec.to_builtins(message.object)
            live = self._get(target.api_version, target.kind, target.name, target.namespace)
            if target.subresource:
                out.print(f"{target}: status is computed from the live objects; not dry-run")
                continue
            applied = self.dyn.server_side_apply(  # type: ignore[no-untyped-call]
                res,
                body=body,
                namespace=target.namespace,
                field_manager=message.field_manager,
                force_conflicts=True,
                dry_run="All",
            ).to_dict()
            diffs = [
                d
                for d in ops.field_diff(_strip(live), _strip(applied))
                if not d[0].startswith("metadata.managedFields")
            ]
            if live is None:
                out.print(f"[green]{target}: would be created[/]")
                differ += 1
            elif diffs:
                differ += 1
                out.print(f"[yellow]{target}: would change[/]")
                for path, old, new in diffs:
                    out.print(f"  {path}: [red]{_short(old)}[/] → [green]{_short(new)}[/]")
            else:
                out.print(f"{target}: unchanged")
        return 0 if differ == 0 else 1


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


async def _dlq(js: Any, args: argparse.Namespace) -> int:
    letters = await ops.dead_letters(js)
    if args.dlq_command == "list" and args.output == "json":
        rows = [
            {"seq": i.seq, "time": _when(i.time), **msgspec.to_builtins(i.letter, builtin_types=(bytes,))}
            for i in letters
        ]
        for row in rows:
            row["payload"] = row["payload"].decode(errors="replace")
        out.print(json.dumps(rows, indent=2))
        return 0
    if args.dlq_command == "list":
        table = Table(title=f"{len(letters)} dead letter(s)")
        for column in ("seq", "time (UTC)", "stage", "reason", "subject", "error"):
            table.add_column(column)
        for item in letters:
            letter = item.letter
            table.add_row(
                str(item.seq), _when(item.time), letter.stage, letter.reason, letter.subject, _short(letter.error)
            )
        out.print(table)
        return 0
    if args.dlq_command == "show":
        match = next((i for i in letters if i.seq == args.seq), None)
        if match is None:
            err.print(f"no dead letter with sequence {args.seq}")
            return 1
        shown = msgspec.to_builtins(match.letter)
        try:
            shown["payload"] = json.loads(match.letter.payload)
        except ValueError:
            shown["payload"] = match.letter.payload.decode(errors="replace")
        out.print(yaml.safe_dump(shown, sort_keys=False), end="")
        return 0
    seqs = [i.seq for i in letters] if args.all else list(args.seq)
    if not seqs:
        err.print("name dead letters by sequence, or pass --all")
        return 2
    import nats.errors

    for seq in seqs:
        try:
            subject = await ops.retry_dead_letter(js, seq)
        except (nats.errors.TimeoutError, TimeoutError):
            # NATS never answers a request its permissions refuse; the silence is the refusal.
            err.print(
                f"tjpipe dlq retry: no answer for dead letter {seq}: the NATS identity in use may not resend "
                "dead letters (use the dlq-operator identity, e.g. NATS_CREDS=.tjpipe/creds/dlq-operator.nk)",
                markup=False,
            )
            return 2
        out.print(f"dead letter {seq} sent back to {subject}")
    return 0

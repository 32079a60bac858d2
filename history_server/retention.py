"""How long each namespace's history is kept, what has expired, and removing it from the bus.

Why a policy file, read from a ConfigMap, and not a label or an annotation on each Namespace: a Namespace is
cluster-scoped, so its labels are set by whoever runs the cluster, and reading them would give the history
server a cluster-wide ``get``/``watch`` on Namespaces it needs for nothing else (its ServiceAccount may create
TokenReviews and SubjectAccessReviews, and that is all). A file mounted from a ConfigMap in the server's own
namespace needs no new permission, is reviewed and versioned with the rest of the deployment, holds the
cluster's default next to the exceptions in one place, and is what Tekton Results' retention policy and
Argo's archive TTL look like to the platform teams who run them. The file is read again when it changes
(a ConfigMap update reaches a mounted file within a minute), so a change needs no restart::

    default:               # every namespace not named below
      keepFor: 30d         # after a TrainJob finished (Complete or Failed) or was deleted
      maxTrainJobs: 1000   # finished or deleted TrainJobs kept per namespace; past it, the oldest go
    namespaces:
      team-nlp: {keepFor: 180d}
      scratch: {keepFor: 1d, maxTrainJobs: 50}

Why counted from the end: a TrainJob that still runs (or waits) is never expired by the policy, whatever its
age; its history is the only account of it. Once it finished or was deleted, it is kept ``keepFor`` more,
findable in the list and readable on its page as before, and then removed. The streams' own age and size
limits (``contracts.streams``) still apply on top: they are the bus's safety net for its disk, so a policy
longer than them keeps no more than they do (the operator raises them to match).

Why one decision for every kind of record: ``expired`` is the only place that says what is gone, and every
store of a TrainJob's records (its events, plans, results, dead letters and progress on the streams here;
another store, such as kept pod logs, plugs in as one more ``RecordStore``) removes exactly what it
returned. Removing is a subject purge bounded by sequence: only records stored before the sweep looked
(``bounds``) go, so a new TrainJob of the same name that arrives meanwhile keeps its own; and at most
``MOST_PER_SWEEP`` TrainJobs go per sweep, so a policy made much shorter drains over a few sweeps instead of
flooding the bus. The purge runs as the ``history-keeper`` NATS identity, which may purge the record
streams and nothing else; no request of a user can start or steer it, so the per-namespace authorization of
reading is untouched: the policy decides what goes, the caller's rights decide only what they may read
until then.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from contracts import streams, subjects
from contracts.streams import parse_duration

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext

    from history_server.index import HistoryIndex, Summary

log = logging.getLogger("history_server.retention")

MOST_PER_SWEEP = 200
"""TrainJobs whose records one sweep removes at most; the rest wait for the next sweep."""


class BadPolicy(ValueError):
    """The retention policy file does not parse: said with the file and the entry."""


@dataclass(frozen=True)
class Keep:
    """One namespace's retention: ``None`` is no limit of the policy's own (the streams' limits only)."""

    keep_for: float | None = None
    """Seconds a TrainJob is kept after it finished or was deleted."""
    max_trainjobs: int | None = None
    """Finished or deleted TrainJobs kept per namespace; past it, the ones that ended first go."""

    def to_json(self) -> dict[str, Any]:
        return {"keepForSeconds": self.keep_for, "maxTrainJobs": self.max_trainjobs}


@dataclass(frozen=True)
class Policy:
    """The cluster's default and each named namespace's own."""

    default: Keep = Keep()
    namespaces: Mapping[str, Keep] = field(default_factory=dict)

    def of(self, namespace: str) -> Keep:
        return self.namespaces.get(namespace, self.default)


class _KeepFile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    keep_for: str | int | float | None = msgspec.field(default=None, name="keepFor")
    max_trainjobs: int | None = msgspec.field(default=None, name="maxTrainJobs")


class _PolicyFile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    default: _KeepFile = msgspec.field(default_factory=_KeepFile)
    namespaces: dict[str, _KeepFile] = {}


def _keep(entry: _KeepFile, where: str) -> Keep:
    keep_for: float | None = None
    if entry.keep_for is not None:
        try:
            keep_for = parse_duration(str(entry.keep_for))
        except ValueError:
            raise BadPolicy(f"{where}: keepFor {entry.keep_for!r} is not a duration such as 90s, 12h or 30d") from None
        if keep_for <= 0:
            raise BadPolicy(f"{where}: keepFor must be more than 0")
    if entry.max_trainjobs is not None and entry.max_trainjobs < 1:
        raise BadPolicy(f"{where}: maxTrainJobs must be at least 1")
    return Keep(keep_for=keep_for, max_trainjobs=entry.max_trainjobs)


def parse_policy(text: str, source: str = "the retention policy") -> Policy:
    """A policy from its YAML (or JSON) text; ``BadPolicy`` naming what is wrong."""
    import yaml

    from tjpipe.operator_commands import valid_namespace

    try:
        raw = yaml.safe_load(text) or {}
        parsed = msgspec.convert(raw, _PolicyFile)
    except (yaml.YAMLError, msgspec.ValidationError) as exc:
        raise BadPolicy(f"{source}: {exc}") from None
    for namespace in parsed.namespaces:
        if not valid_namespace(namespace):
            raise BadPolicy(f"{source}: {namespace!r} is not a namespace name")
    return Policy(
        default=_keep(parsed.default, f"{source}, default"),
        namespaces={ns: _keep(entry, f"{source}, namespace {ns}") for ns, entry in parsed.namespaces.items()},
    )


# ------------------------------------------------------------------------------------ the decision


def kept_until(summary: Summary, keep: Keep) -> float | None:
    """When the policy removes this TrainJob's history (Unix seconds); ``None`` while it has not ended, or
    when the policy sets no age."""
    if keep.keep_for is None or not summary.ended_at:
        return None
    return summary.ended_at + keep.keep_for


def expired(summaries: Iterable[Summary], policy: Policy, now: float) -> list[Summary]:
    """The TrainJobs whose history has expired at ``now``, the one that ended first first: those whose
    ``keepFor`` has passed, and in a namespace with more ended TrainJobs than its ``maxTrainJobs``, the ones
    that ended first beyond that count. The one place that says what is gone, for every store.

    Linear in the TrainJobs; only a namespace over its count is sorted (a sweep runs on the server's loop)."""
    ended: dict[str, list[Summary]] = {}
    for summary in summaries:
        if summary.ended_at:
            ended.setdefault(summary.namespace, []).append(summary)
    out: list[Summary] = []
    for namespace, jobs in ended.items():
        keep = policy.of(namespace)
        cutoff = now - keep.keep_for if keep.keep_for is not None else float("-inf")
        kept = [s for s in jobs if s.ended_at > cutoff]
        if len(kept) < len(jobs):
            out += [s for s in jobs if s.ended_at <= cutoff]
        if keep.max_trainjobs is not None and len(kept) > keep.max_trainjobs:
            kept.sort(key=lambda s: (-s.ended_at, s.name))  # the newest ended first: they are the ones kept
            out += kept[keep.max_trainjobs :]
    out.sort(key=lambda s: (s.ended_at, s.namespace, s.name))
    return out


def retention_of(summary: Summary, policy: Policy | None, now: float) -> dict[str, Any]:
    """What a TrainJob's page says about how long it is kept."""
    if policy is None:
        return {"policy": False, "keptUntil": None, "ended": summary.ended_at or None, "expired": False}
    keep = policy.of(summary.namespace)
    until = kept_until(summary, keep)
    return {
        "policy": True,
        **keep.to_json(),
        "keptUntil": until,
        "keptUntilText": _utc(until) if until is not None else None,
        "ended": summary.ended_at or None,
        "expired": until is not None and until <= now,
    }


def _utc(when: float) -> str:
    return dt.datetime.fromtimestamp(when, tz=dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# ----------------------------------------------------------------------------------- the stores


class RecordStore(Protocol):
    """Somewhere a TrainJob's records are kept, which removes them when the policy says they expired."""

    async def bounds(self) -> dict[str, int]:
        """Where each of its streams (or buckets) ends now: what a purge after this may remove at most."""
        ...

    async def purge(self, summary: Summary, bounds: Mapping[str, int]) -> int:
        """Remove the records of the TrainJob ``summary`` names (its namespace and name; ``uid`` is the newest
        TrainJob of that name, for a store keyed by it) stored before ``bounds``; how many went. Every
        TrainJob of that name goes: the streams keep one subject per name."""
        ...


def _filters(namespace: str, name: str) -> dict[str, str]:
    """One TrainJob's subjects in each record stream (its names are Kubernetes names: no wildcard in them)."""
    return {
        streams.EVENTS_HISTORY.name: subjects.trainjob_events_filter(namespace, name),
        streams.APPLY_HISTORY.name: subjects.trainjob_apply_filter(namespace, name),
        streams.RESULTS.name: subjects.trainjob_results_filter(namespace, name),
        streams.DLQ.name: f"{subjects.DLQ_PREFIX}.*.{namespace}.{name}",
        streams.PROGRESS.name: subjects.trainjob_progress_filter(namespace, name),
    }


class PurgeRefused(Exception):
    """The NATS server did not purge (a permission, a missing stream): logged, tried again next sweep."""


class StreamRecords:
    """The record streams: events, plans, results, dead letters and progress, purged by subject."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc

    async def bounds(self) -> dict[str, int]:
        out: dict[str, int] = {}
        js = self._nc.jetstream()
        for stream in _filters("x", "x"):
            try:
                info = await js.stream_info(stream)
            except Exception as exc:  # a bus set up before progress was recorded has no progress stream
                log.debug("no bounds of %s: %s", stream, type(exc).__name__)
                continue
            out[stream] = int(info.state.last_seq or 0) + 1
        return out

    async def purge(self, summary: Summary, bounds: Mapping[str, int]) -> int:
        purged = 0
        for stream, subject in _filters(summary.namespace, summary.name).items():
            upto = bounds.get(stream)
            if not upto or upto <= 1:
                continue
            body = json.dumps({"filter": subject, "seq": upto}).encode()
            reply = await self._nc.request(f"$JS.API.STREAM.PURGE.{stream}", body, timeout=10)
            answer = json.loads(reply.data)
            if "error" in answer:
                raise PurgeRefused(f"{stream}: {answer['error'].get('description', answer['error'])}")
            purged += int(answer.get("purged", 0))
        return purged


class KeptLogs:
    """The pods' logs kept in the logs bucket (``contracts.logs``), stored under the TrainJob's uid: the objects
    of the newest TrainJob of the name are found with the server's read-only connection (``reader``), then
    marked deleted and their chunks purged by the keeper, which may not read a log. An object store has no
    sequence bound per TrainJob (a capture is written whole), so ``bounds`` names none."""

    def __init__(self, nc: Client, reader: JetStreamContext) -> None:
        self._nc, self._reader = nc, reader

    async def bounds(self) -> dict[str, int]:
        return {}

    async def purge(self, summary: Summary, bounds: Mapping[str, int]) -> int:
        from contracts import logs
        from plumbing import object_store

        if not summary.uid:
            return 0
        where = logs.prefix("", summary.namespace, summary.uid)
        try:
            found = await object_store.find_prefix(self._reader, streams.LOGS, where)
            gone = await object_store.delete_found(self._nc.jetstream(), streams.LOGS, found)
        except Exception as exc:  # a permission, a bus without the logs bucket: said, and tried next sweep
            raise PurgeRefused(f"{streams.LOGS.stream}: {type(exc).__name__}: {exc}") from None
        return len(gone)


# ----------------------------------------------------------------------------------- the sweep


def valid_key(namespace: str, name: str) -> bool:
    """Both are Kubernetes names (so neither holds a subject wildcard or a dot): what a purge filter may name."""
    from tjpipe.exits import UsageError
    from tjpipe.operator_commands import trainjob_key

    try:
        trainjob_key(f"{namespace}/{name}", None)
    except UsageError:
        return False
    return True


@dataclass
class Retention:
    """The policy (from ``path``, read again when it changes) and the stores its sweeps purge."""

    path: Path
    stores: list[RecordStore]
    policy: Policy = field(default_factory=Policy)
    _stamp: tuple[int, int, int] = (0, 0, 0)
    purged_trainjobs: int = 0
    purged_records: int = 0

    def load(self) -> Policy:
        """The policy, read again if the file changed; the previous one kept (and said) if the new one is bad."""
        stat = self.path.stat()
        stamp = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if stamp != self._stamp:
            try:
                self.policy = parse_policy(self.path.read_text(), str(self.path))
            except BadPolicy as exc:
                if self._stamp == (0, 0, 0):
                    raise
                log.error("%s; the previous retention policy stays in force", exc)
            else:
                log.info(
                    "retention policy from %s: %d namespace(s) of their own", self.path, len(self.policy.namespaces)
                )
            self._stamp = stamp
        return self.policy

    async def bounds(self) -> list[dict[str, int]]:
        """Each store's bounds, taken before the index catches up (see the module's docstring)."""
        return [await store.bounds() for store in self.stores]

    async def sweep(self, index: HistoryIndex, bounds: list[dict[str, int]], now: float) -> int:
        """Purge what expired (at most ``MOST_PER_SWEEP`` TrainJobs) and forget it; how many TrainJobs went."""
        try:
            policy = self.load()
        except (OSError, BadPolicy) as exc:
            log.error("retention policy %s not read: %s", self.path, exc)
            return 0
        gone = 0
        for summary in expired(index.summaries(), policy, now)[:MOST_PER_SWEEP]:
            if not valid_key(summary.namespace, summary.name):
                continue
            try:
                for store, bound in zip(self.stores, bounds, strict=True):
                    self.purged_records += await store.purge(summary, bound)
            except Exception as exc:  # the bus away for a moment or a refusal: kept, tried again next sweep
                log.warning("could not remove the history of %s/%s: %s", summary.namespace, summary.name, exc)
                continue
            index.forget(summary.namespace, summary.name)
            gone += 1
        if gone:
            self.purged_trainjobs += gone
            log.info("retention: removed the history of %d TrainJob(s)", gone)
        return gone


def load_retention(path: str, nc: Client, reader: JetStreamContext) -> Retention:
    """The retention of ``--retention-policy``, checked now so that a bad file stops the server at start."""
    found = Path(os.path.expanduser(path))
    retention = Retention(path=found, stores=[StreamRecords(nc), KeptLogs(nc, reader)])
    retention.load()
    return retention

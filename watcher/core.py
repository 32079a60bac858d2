"""What the watcher decides, without the watching: which objects belong together and what to publish.

Kept apart from the list/watch loop so the rules (how a runtimeRef resolves, which TrainJob owns a JobSet,
what makes two observations the same message) are unit-tested without a cluster, and so that the message
id — the key of JetStream's de-duplication — is computed in exactly one place.
"""

from __future__ import annotations

import collections
import functools
import json
from collections.abc import Iterable
from typing import Any

import msgspec
import yaml

from contracts import lifecycle, trainer
from contracts.jobset import JobSet
from contracts.kube import ConfigMap, OwnerReference
from contracts.messages import FIELD_MANAGER
from contracts.trainer import RuntimeRef, TrainingRuntime, TrainJob, TrainJobSpec
from contracts.values import is_set, meta, name_of, namespace_of, or_default, resource_version_of, uid_of
from watcher import trim

RuntimeKey = tuple[str, str, str]
"""(kind, namespace, name); namespace is empty for a ClusterTrainingRuntime."""
TrainJobKey = tuple[str, str]
"""(namespace, name) of a TrainJob."""

_NO_REF = RuntimeRef()
_NO_SPEC = TrainJobSpec()


def runtime_key_of(job: TrainJob) -> RuntimeKey | None:
    """The runtime a TrainJob refers to, or ``None`` when the reference names another API group or kind."""
    ref = or_default(or_default(job.spec, _NO_SPEC).runtime_ref, _NO_REF)
    group = or_default(ref.api_group, trainer.GROUP)
    kind = or_default(ref.kind, trainer.CLUSTER_TRAINING_RUNTIME_KIND)
    name = or_default(ref.name, "")
    if group != trainer.GROUP or not name:
        return None
    if kind == trainer.CLUSTER_TRAINING_RUNTIME_KIND:
        return (kind, "", name)
    if kind == trainer.TRAINING_RUNTIME_KIND:
        return (kind, namespace_of(job), name)
    return None


class TrainJobsByRuntime:
    """Which TrainJobs refer to each runtime, so that a runtime's change reaches only those.

    Without it, a change to one runtime decoded every cached TrainJob to find the few that name it: with ten
    thousand TrainJobs, ten thousand decompressions and decodes for each edit of any runtime. The watcher
    keeps it in step with its TrainJob informers (every change of a TrainJob passes through ``put``, every
    deletion through ``discard``), as client-go's indexers keep an informer's cache indexed. The lookup is a
    candidate list: the caller checks each TrainJob's runtimeRef as it reads it, since the cache may already
    hold a newer version whose event has not been handled yet.
    """

    def __init__(self) -> None:
        self._by_runtime: dict[RuntimeKey, dict[TrainJobKey, None]] = {}
        self._runtime_of: dict[TrainJobKey, RuntimeKey] = {}

    def put(self, trainjob: TrainJobKey, runtime: RuntimeKey | None) -> None:
        """The TrainJob now refers to ``runtime`` (``None``: to no runtime the watcher follows)."""
        if self._runtime_of.get(trainjob) == runtime:
            return
        self.discard(trainjob)
        if runtime is not None:
            self._runtime_of[trainjob] = runtime
            self._by_runtime.setdefault(runtime, {})[trainjob] = None

    def discard(self, trainjob: TrainJobKey) -> None:
        runtime = self._runtime_of.pop(trainjob, None)
        if runtime is None:
            return
        trainjobs = self._by_runtime[runtime]
        del trainjobs[trainjob]
        if not trainjobs:
            del self._by_runtime[runtime]

    def trainjobs(self, runtime: RuntimeKey) -> list[TrainJobKey]:
        """The TrainJobs that refer to ``runtime``, in the order they were first seen to (a copy)."""
        return list(self._by_runtime.get(runtime, ()))

    def __len__(self) -> int:
        return len(self._runtime_of)


def runtime_key_of_runtime(runtime: TrainingRuntime, *, kind: str) -> RuntimeKey:
    namespace = namespace_of(runtime) if kind == trainer.TRAINING_RUNTIME_KIND else ""
    return (kind, namespace, name_of(runtime))


def controlling_trainjob(jobset: JobSet) -> str | None:
    """The name of the TrainJob that controls this JobSet, if a TrainJob does."""
    return controlled_by_trainjob(meta(jobset).owner_references)


def message_id(
    job: TrainJob,
    *,
    runtime: TrainingRuntime | None,
    jobset: JobSet | None,
    runtime_kind: str = "",
    snapshot: ConfigMap | None = None,
    drift: Iterable[str] = (),
) -> str:
    """``uid/resourceVersion`` of the TrainJob, extended by the versions of what the event also carries.

    Two observations with the same id carry the same content, so the stream may drop the second one; an
    event caused by a JobSet status change differs from the previous one only in the JobSet's version, so
    that version must be part of the id or the change would be dropped as a duplicate. A component the
    event does not carry (a PodGroup, the MPI hostfile) changed or deleted by someone else differs in
    nothing the event holds: its ``drift_mark`` goes into the id, or the repair would be dropped the same way.
    """
    parts = [f"{uid_of(job)}/{resource_version_of(job)}"]
    if jobset is not None:
        parts.append(f"js={resource_version_of(jobset)}")
    if runtime is not None:
        parts.append(f"rt={runtime_kind}:{resource_version_of(runtime)}")
    if snapshot is not None:
        parts.append(f"snap={resource_version_of(snapshot)}")
    if marks := sorted(set(drift)):
        parts.append(f"drift={','.join(marks)}")
    return ";".join(parts)


DRIFT_CHANGES = frozenset({"MODIFIED", "DELETED"})
"""The changes to a component that may be drift to repair; an ADDED one is the plan's own object appearing."""


def drift_mark(kind: str, change: str, name: str, resource_version: str) -> str | None:
    """What names one change of a component the event does not carry, for ``message_id``; None for a change
    that is no drift (``DRIFT_CHANGES``) or a kind the id already follows (the JobSet). The change is part
    of it: a deletion may arrive with the version of the last edit."""
    if change not in DRIFT_CHANGES or kind == "JobSet":
        return None
    return f"{kind}/{name}@{resource_version}:{change}"


def is_suspended(job: TrainJob) -> bool:
    return or_default(job.spec, _NO_SPEC).suspend is True


def snapshot_name_of(job: TrainJob) -> str:
    return snapshot_name(name_of(job))


def snapshot_name(trainjob_name: str) -> str:
    """The runtime snapshot ConfigMap's name for the TrainJob of that name."""
    return trainjob_name + trainer.RUNTIME_SNAPSHOT_SUFFIX


def controlled_by_trainjob(owner_refs: list[OwnerReference] | msgspec.UnsetType) -> str | None:
    """The name of the TrainJob named as controller in these owner references, if any."""
    for ref in or_default(owner_refs, []):
        if ref.controller is True and ref.kind == trainer.TRAINJOB_KIND and ref.api_version == trainer.API_VERSION:
            return or_default(ref.name, None)
    return None


_SnapshotLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=64)
def parse_snapshot(text: str) -> TrainingRuntime:
    """One runtime's snapshot text, parsed once: every TrainJob of that runtime holds the same text.

    The result is a frozen struct shared between callers, which only read it.
    """
    return msgspec.convert(yaml.load(text, Loader=_SnapshotLoader), TrainingRuntime)


def runtime_from_snapshot(job: TrainJob, snapshot: ConfigMap) -> tuple[TrainingRuntime | None, str]:
    """The runtime recorded in a TrainJob's snapshot ConfigMap, or an error saying why it cannot be used.

    The checks are Trainer's: the snapshot must be controlled by this TrainJob's UID, hold the ``runtime``
    key, parse, and name the runtime the TrainJob refers to (kind and group only where the ref sets them).
    """
    owners = or_default(meta(snapshot).owner_references, [])
    if not any(o.controller is True and o.uid == uid_of(job) for o in owners):
        return None, "invalid runtime snapshot: a snapshot configmap exists but is owned by another object"
    data = or_default(snapshot.data, {})
    text = data.get(trainer.RUNTIME_SNAPSHOT_KEY)
    if text is None:
        return None, f"invalid runtime snapshot: snapshot ConfigMap missing {trainer.RUNTIME_SNAPSHOT_KEY!r} data key"
    try:
        runtime = parse_snapshot(text)
    except (yaml.YAMLError, msgspec.ValidationError) as exc:
        return None, f"invalid runtime snapshot: unable to unmarshal the snapshot: {exc}"
    ref = or_default(or_default(job.spec, _NO_SPEC).runtime_ref, _NO_REF)
    api_version = or_default(runtime.api_version, "")
    group = api_version.rpartition("/")[0]
    kind = or_default(runtime.kind, "")
    mismatch = (
        (is_set(ref.kind) and kind != ref.kind)
        or (is_set(ref.api_group) and group != ref.api_group)
        or name_of(runtime) != or_default(ref.name, "")
    )
    if mismatch:
        return None, (
            "invalid runtime snapshot: the snapshot refers to the wrong runtime: expecting "
            f"{or_default(ref.name, '')!r}, {or_default(ref.api_group, '<any>')!r}, {or_default(ref.kind, '<any>')!r} "
            f"but found {name_of(runtime)!r}, {group!r}, {kind!r}"
        )
    return runtime, ""


def half_built(causes: list[str], *, has_snapshot: bool, has_jobset: bool) -> bool:
    """A TrainJob's first plan is half in the cluster: its runtime snapshot or its JobSet, not yet both.

    The applier writes the two at nearly the same moment, but under load they can land further apart than
    the watcher's gathering window. An observation holding only one of them has the planner send the
    other a second time (and the applier read it, and record it, to find it unchanged), so while nothing
    but additions were seen it is worth holding the observation back a little for the other to arrive.
    A deletion or modification is drift, and goes out at once.
    """
    if has_snapshot == has_jobset:
        return False
    return all(cause.endswith(" ADDED") for cause in causes)


def active_label(job: TrainJob) -> tuple[str, str] | None:
    """(namespace, runtime) of a TrainJob that counts as active, ``None`` for a finished one or another controller's."""
    if not lifecycle.is_ours(job) or lifecycle.is_finished(job):
        return None
    return (namespace_of(job), lifecycle.runtime_label(job))


def active_counts(labels: Iterable[tuple[str, str] | None]) -> dict[tuple[str, str], int]:
    return dict(collections.Counter(label for label in labels if label is not None))


# ------------------------------------------------------------------------------------ the pipeline's echoes


def own_status_write(before: TrainJob, after: TrainJob, *, manager: str = FIELD_MANAGER) -> bool:
    """Whether all that changed from ``before`` to ``after`` is status that ``manager`` itself wrote.

    ``before`` is the watcher's cached copy; ``after`` is the object as the API server sent it, with its
    ``managedFields``. Two things must hold. Nothing but the status (and the bookkeeping of
    ``resourceVersion`` and ``managedFields``) differs: a change of spec, labels or annotations is someone
    else's. And every status field that differs is one ``manager`` owns by its Apply on the status
    subresource in ``after``: another writer that changed such a field would own it now (an update takes the
    fields it changes, a forced apply too), so a field it changed cannot pass as ours. A field that went
    away, or a list entry the fields set does not name, cannot be told apart and counts as someone else's:
    the observation then goes on to the planner as before, which costs only what it always did.
    """
    owned = _owned_status(after, manager)  # the cheap test first: a TrainJob we never wrote status to
    if owned is None or _apart_from_status(before) != _apart_from_status(after):
        return False
    return _covered(_status_of(before), _status_of(after), owned)


def _apart_from_status(job: TrainJob) -> TrainJob:
    trimmed = trim.trainjob(job)  # the cached copy is trimmed: compare like with like
    stripped = msgspec.structs.replace(meta(trimmed), resource_version=msgspec.UNSET, managed_fields=msgspec.UNSET)
    return msgspec.structs.replace(trimmed, metadata=stripped, status=msgspec.UNSET)


def _status_of(job: TrainJob) -> dict[str, Any]:
    return msgspec.to_builtins(job.status) if is_set(job.status) else {}


def _owned_status(job: TrainJob, manager: str) -> dict[str, Any] | None:
    for entry in or_default(meta(job).managed_fields, []):
        if entry.manager == manager and entry.subresource == "status" and entry.operation == "Apply":
            fields = entry.fields_v1 if isinstance(entry.fields_v1, dict) else {}
            owned = fields.get("f:status")
            return owned if isinstance(owned, dict) else None
    return None


def _covered(before: Any, after: Any, owned: dict[str, Any] | None) -> bool:
    """Every difference between ``before`` and ``after`` lies in fields the ``owned`` set (fieldsV1) names."""
    if before == after:
        return True
    if owned is None or after is None:
        return False
    if before is None and isinstance(after, dict):
        before = {}  # a field or list entry new in ``after``: each of its own fields must be owned
    if isinstance(before, dict) and isinstance(after, dict):
        return all(_covered(before.get(k), after.get(k), owned.get("f:" + k)) for k in before.keys() | after.keys())
    keyed = {k: v for k, v in owned.items() if k.startswith("k:")}
    if isinstance(after, list) and keyed:
        old, new = _by_key(before if isinstance(before, list) else [], keyed), _by_key(after, keyed)
        if old is None or new is None:
            return False
        return all(_covered(old.get(k), new.get(k), keyed[k]) for k in old.keys() | new.keys())
    return not owned  # a leaf (an empty set in fieldsV1) is owned whole, whatever its value


def _by_key(items: list[Any], keyed: dict[str, Any]) -> dict[str, Any] | None:
    """A list-map's entries by the ``k:`` key of the fields set that names each; ``None`` if one is unnamed."""
    keys = [(k, json.loads(k[2:])) for k in keyed]
    found: dict[str, Any] = {}
    for item in items:
        name = next(
            (k for k, key in keys if isinstance(item, dict) and all(item.get(f) == v for f, v in key.items())),
            None,
        )
        if name is None:
            return None
        found[name] = item
    return found


DEADLINE_CAUSE = "deadline reached"
"""The cause of the observation the watcher makes when a TrainJob's active deadline passes."""

DECIDING_KINDS = (trainer.CLUSTER_TRAINING_RUNTIME_KIND, trainer.TRAINING_RUNTIME_KIND)
"""Kinds whose change can change what the planner decides for a TrainJob, beyond the JobSet's status."""


def changes_the_decision(cause: str) -> bool:
    """Whether an observation with this cause may be planned to other conditions than the TrainJob's last.

    An echo is planned from its status alone (``planner.core``): what a JobSet's status says is read again
    there, so a JobSet's or a component's change needs nothing more; a component that went away is planned
    whole by its own observation, which an echo never shadows (``EchoGuard.message_id``). A runtime's
    change, a runtime snapshot that changed or went away, a deadline or a resync may change the conditions
    the planner decides.
    """
    for part in cause.split(" + "):
        kind, _, what = part.partition(" ")
        if kind in DECIDING_KINDS or part == DEADLINE_CAUSE or what == "RESYNC":
            return True
        if kind == "ConfigMap" and what != "ADDED":
            return True
    return False


class EchoGuard:
    """When an observation caused only by the pipeline's own status write may be planned from its status alone.

    The pipeline's status write is conditional on the TrainJob version it was planned from. Several
    observations may go out at one version (the TrainJob changed, then its components were made, then its
    JobSet's status moved): each plan from them carries a status, the first one applied changes the
    version, and the later ones are refused as stale (409) and dropped. What they knew comes back with the
    echo of the write that was made: the planner plans the echo's status again from the JobSet it carries,
    which is the newest. That covers everything but a change of the planner's own decision (a runtime that
    changed or appeared, a deadline): if such an observation went out at the version the echo replaces, after
    the first one, the echo is planned whole, as any other. Kept per TrainJob, for its latest version only.
    """

    def __init__(self) -> None:
        self._deciding: dict[TrainJobKey, tuple[str, bool]] = {}
        self._whole: dict[TrainJobKey, str] = {}

    def message_id(self, key: TrainJobKey, whole_id: str, *, echo: bool) -> str:
        """The id an observation goes out with, ``whole_id`` being ``message_id`` of what it carries.

        A whole observation goes out under ``whole_id``, which is remembered. An echo of the same objects as
        the last whole one goes out under the same id, and the stream drops it: nothing in it is new. Any
        other echo gets an id of its own (``;echo``), because it is planned from its status alone and so is
        not the same as a whole observation of the same objects: a JobSet deleted just after the pipeline's
        status write is seen first by the echo (no JobSet, status only), then by its own observation at the
        same versions (no JobSet, planned whole, the JobSet made again), which must not be dropped as the
        echo's duplicate.
        """
        if not echo:
            self._whole[key] = whole_id
            return whole_id
        return whole_id if self._whole.get(key) == whole_id else f"{whole_id};echo"

    def published(self, key: TrainJobKey, resource_version: str, cause: str) -> None:
        """An observation of the TrainJob at ``resource_version`` is going out (a duplicate counts too)."""
        version, deciding = self._deciding.get(key, ("", False))
        if version != resource_version:
            self._deciding[key] = (resource_version, False)  # the first at a version starts from the TrainJob
        elif not deciding and changes_the_decision(cause):
            self._deciding[key] = (version, True)

    def may_skip(self, key: TrainJobKey) -> bool:
        """Whether the TrainJob's echo may be planned from its status alone."""
        return not self._deciding.get(key, ("", False))[1]

    def forget(self, key: TrainJobKey) -> None:
        self._deciding.pop(key, None)
        self._whole.pop(key, None)

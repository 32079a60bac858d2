"""What the watcher decides, without the watching: which objects belong together and what to publish.

Kept apart from the list/watch loop so the rules (how a runtimeRef resolves, which TrainJob owns a JobSet,
what makes two observations the same message) are unit-tested without a cluster, and so that the message
id — the key of JetStream's de-duplication — is computed in exactly one place.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Iterable

import msgspec
import yaml

from contracts import lifecycle, trainer
from contracts.jobset import JobSet
from contracts.kube import ConfigMap, OwnerReference
from contracts.trainer import RuntimeRef, TrainingRuntime, TrainJob, TrainJobSpec
from contracts.values import is_set, meta, name_of, namespace_of, or_default, resource_version_of, uid_of

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
) -> str:
    """``uid/resourceVersion`` of the TrainJob, extended by the versions of what the event also carries.

    Two observations with the same id carry the same content, so the stream may drop the second one; an
    event caused by a JobSet status change differs from the previous one only in the JobSet's version, so
    that version must be part of the id or the change would be dropped as a duplicate.
    """
    parts = [f"{uid_of(job)}/{resource_version_of(job)}"]
    if jobset is not None:
        parts.append(f"js={resource_version_of(jobset)}")
    if runtime is not None:
        parts.append(f"rt={runtime_kind}:{resource_version_of(runtime)}")
    if snapshot is not None:
        parts.append(f"snap={resource_version_of(snapshot)}")
    return ";".join(parts)


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

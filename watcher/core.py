"""What the watcher decides, without the watching: which objects belong together and what to publish.

Kept apart from the list/watch loop so the rules (how a runtimeRef resolves, which TrainJob owns a JobSet,
what makes two observations the same message) are unit-tested without a cluster, and so that the message
id — the key of JetStream's de-duplication — is computed in exactly one place.
"""

from __future__ import annotations

import msgspec

from contracts import trainer
from contracts.jobset import JobSet
from contracts.messages import TrainJobObserved
from contracts.trainer import TrainingRuntime, TrainJob

RuntimeKey = tuple[str, str, str]
"""(kind, namespace, name); namespace is empty for a ClusterTrainingRuntime."""


def _set(value: object) -> bool:
    return value is not msgspec.UNSET and value is not None


def runtime_key_of(job: TrainJob) -> RuntimeKey | None:
    """The runtime a TrainJob refers to, or ``None`` when the reference names another API group or kind."""
    spec = job.spec
    if not _set(spec) or not _set(spec.runtime_ref):
        return None
    ref = spec.runtime_ref
    group = ref.api_group if _set(ref.api_group) else trainer.GROUP
    kind = ref.kind if _set(ref.kind) else trainer.CLUSTER_TRAINING_RUNTIME_KIND
    name = ref.name if _set(ref.name) else ""
    if group != trainer.GROUP or not name:
        return None
    if kind == trainer.CLUSTER_TRAINING_RUNTIME_KIND:
        return (kind, "", name)
    if kind == trainer.TRAINING_RUNTIME_KIND:
        return (kind, str(job.metadata.namespace), name)
    return None


def runtime_key_of_runtime(runtime: TrainingRuntime, *, kind: str) -> RuntimeKey:
    namespace = runtime.metadata.namespace if kind == trainer.TRAINING_RUNTIME_KIND else ""
    return (kind, str(namespace) if _set(namespace) else "", str(runtime.metadata.name))


def controlling_trainjob(jobset: JobSet) -> str | None:
    """The name of the TrainJob that controls this JobSet, if a TrainJob does."""
    refs = jobset.metadata.owner_references
    if not _set(refs):
        return None
    for ref in refs:
        if ref.controller is True and ref.kind == trainer.TRAINJOB_KIND and ref.api_version == trainer.API_VERSION:
            return str(ref.name)
    return None


def message_id(
    job: TrainJob, *, runtime: TrainingRuntime | None, jobset: JobSet | None, runtime_kind: str = ""
) -> str:
    """``uid/resourceVersion`` of the TrainJob, extended by the versions of what the event also carries.

    Two observations with the same id carry the same content, so the stream may drop the second one; an
    event caused by a JobSet status change differs from the previous one only in the JobSet's version, so
    that version must be part of the id or the change would be dropped as a duplicate.
    """
    parts = [f"{job.metadata.uid}/{job.metadata.resource_version}"]
    if jobset is not None:
        parts.append(f"js={jobset.metadata.resource_version}")
    if runtime is not None:
        parts.append(f"rt={runtime_kind}:{runtime.metadata.resource_version}")
    return ";".join(parts)


def observe(
    job: TrainJob,
    *,
    runtime: TrainingRuntime | None,
    jobset: JobSet | None,
    now: float,
    cause: str,
    trace_id: str = "",
) -> TrainJobObserved:
    return TrainJobObserved(
        trainjob=job, runtime=runtime, jobset=jobset, observed_at=now, cause=cause, trace_id=trace_id
    )


def is_suspended(job: TrainJob) -> bool:
    return _set(job.spec) and job.spec.suspend is True

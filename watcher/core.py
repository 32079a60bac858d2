"""What the watcher decides, without the watching: which objects belong together and what to publish.

Kept apart from the list/watch loop so the rules (how a runtimeRef resolves, which TrainJob owns a JobSet,
what makes two observations the same message) are unit-tested without a cluster, and so that the message
id — the key of JetStream's de-duplication — is computed in exactly one place.
"""

from __future__ import annotations

from contracts import trainer
from contracts.jobset import JobSet
from contracts.messages import TrainJobObserved
from contracts.trainer import RuntimeRef, TrainingRuntime, TrainJob, TrainJobSpec
from contracts.values import meta, name_of, namespace_of, or_default, resource_version_of, uid_of

RuntimeKey = tuple[str, str, str]
"""(kind, namespace, name); namespace is empty for a ClusterTrainingRuntime."""

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


def runtime_key_of_runtime(runtime: TrainingRuntime, *, kind: str) -> RuntimeKey:
    namespace = namespace_of(runtime) if kind == trainer.TRAINING_RUNTIME_KIND else ""
    return (kind, namespace, name_of(runtime))


def controlling_trainjob(jobset: JobSet) -> str | None:
    """The name of the TrainJob that controls this JobSet, if a TrainJob does."""
    for ref in or_default(meta(jobset).owner_references, []):
        if ref.controller is True and ref.kind == trainer.TRAINJOB_KIND and ref.api_version == trainer.API_VERSION:
            return or_default(ref.name, None)
    return None


def message_id(job: TrainJob, *, runtime: TrainingRuntime | None, jobset: JobSet | None, runtime_kind: str = "") -> str:
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
    return or_default(job.spec, _NO_SPEC).suspend is True

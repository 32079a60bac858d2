"""How much of each watched object the watcher keeps: what an event's reader needs, and nothing more.

Every TrainJob brings a JobSet and a runtime snapshot ConfigMap with it, and the watcher caches all three
for as long as the TrainJob exists, so whatever is kept of them is paid ten thousand times over in a big
cluster (and again in every event). A JobSet or a ConfigMap is not what the planner plans from; it only
reads a few parts of it, so those are the parts listed here to keep, and a field added to the types later
is left out until something reads it:

* a JobSet: its identity and controller reference (``watcher.core.controlling_trainjob``; the resource
  version for the message id and ``planner.core.observation_version``), ``spec.suspend``
  (``planner.core._suspended``), ``spec.replicatedJobs`` in full and the other spec fields JobSet never
  lets change (``planner.immutability.IMMUTABLE_SPEC``: ``network``, ``successPolicy``, ``failurePolicy``,
  ``startupPolicy``, ``volumeClaimPolicies``, ``managedBy``), since ``restrict_to_mutable`` sends them
  back as the live object has them, JobSet's defaults and other managers' fields included, and
  ``status.conditions`` and the counters of
  ``status.replicatedJobsStatus`` (``planner.status.desired_status``);
* a ConfigMap: its identity and controller reference (``watcher.service`` finds the owner to plan again,
  ``watcher.core.runtime_from_snapshot`` checks it), and the ``runtime`` key of a runtime snapshot;
* a Secret, PodGroup or PriorityClass: its identity and controller reference. Labels and annotations go
  too, and with them any ``last-applied-configuration`` that would repeat a Secret's data.

A TrainJob is the planner's main input and is kept whole, but for what only the API server reads: its
``last-applied-configuration`` annotation, a second copy of the object that ``kubectl apply`` leaves.
Runtimes are kept whole too (``managedFields`` aside, as for every object): the planner copies the
runtime, metadata and all, into the snapshot it writes.
"""

from __future__ import annotations

import msgspec

from contracts import trainer
from contracts.jobset import JobSet, JobSetSpec, JobSetStatus, ReplicatedJobStatus
from contracts.kube import ConfigMap, ObjectMeta
from contracts.trainer import TrainJob
from contracts.values import is_set, meta, name_of

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

_UNSET = msgspec.UNSET


def identity(metadata: ObjectMeta | msgspec.UnsetType) -> ObjectMeta:
    """Name, namespace, uid, resourceVersion and owner references; the rest of the metadata goes."""
    if not is_set(metadata):
        return ObjectMeta()
    return ObjectMeta(
        name=metadata.name,
        namespace=metadata.namespace,
        uid=metadata.uid,
        resource_version=metadata.resource_version,
        owner_references=metadata.owner_references,
    )


def trainjob(job: TrainJob) -> TrainJob:
    annotations = meta(job).annotations
    if not is_set(annotations) or LAST_APPLIED not in annotations:
        return job
    rest = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    metadata = msgspec.structs.replace(meta(job), annotations=rest or _UNSET)
    return msgspec.structs.replace(job, metadata=metadata)


# The keyword lists below are the choice of fields the watcher keeps, one list per object.
def jobset(js: JobSet) -> JobSet:
    spec: JobSetSpec | msgspec.UnsetType = _UNSET
    if is_set(js.spec):
        spec = JobSetSpec(
            replicated_jobs=js.spec.replicated_jobs,
            suspend=js.spec.suspend,
            network=js.spec.network,
            success_policy=js.spec.success_policy,
            failure_policy=js.spec.failure_policy,
            startup_policy=js.spec.startup_policy,
            volume_claim_policies=js.spec.volume_claim_policies,
            managed_by=js.spec.managed_by,
        )
    status: JobSetStatus | msgspec.UnsetType = _UNSET
    if is_set(js.status):
        replicated: list[ReplicatedJobStatus] | msgspec.UnsetType = _UNSET
        if is_set(js.status.replicated_jobs_status):
            replicated = [
                ReplicatedJobStatus(
                    name=rj.name,
                    ready=rj.ready,
                    succeeded=rj.succeeded,
                    failed=rj.failed,
                    active=rj.active,
                    suspended=rj.suspended,
                )
                for rj in js.status.replicated_jobs_status
            ]
        status = JobSetStatus(conditions=js.status.conditions, replicated_jobs_status=replicated)
    return JobSet(api_version=js.api_version, kind=js.kind, metadata=identity(js.metadata), spec=spec, status=status)


def is_runtime_snapshot_name(name: str) -> bool:
    """Could this ConfigMap be some TrainJob's runtime snapshot? (The watcher finds snapshots by name.)"""
    return name.endswith(trainer.RUNTIME_SNAPSHOT_SUFFIX)


def config_map(cm: ConfigMap) -> ConfigMap:
    data: dict[str, str] | msgspec.UnsetType = _UNSET
    if is_runtime_snapshot_name(name_of(cm)) and is_set(cm.data) and trainer.RUNTIME_SNAPSHOT_KEY in cm.data:
        data = {trainer.RUNTIME_SNAPSHOT_KEY: cm.data[trainer.RUNTIME_SNAPSHOT_KEY]}
    return ConfigMap(api_version=cm.api_version, kind=cm.kind, metadata=identity(cm.metadata), data=data)

"""The controller owner reference every component carries back to its TrainJob.

Every builder (JobSet, PodGroups, ConfigMaps, Secrets, the runtime snapshot) sets the same reference, so it
lives outside the plugins: plugins import only the framework and shared modules, never each other. The
applier refuses any component without exactly this one controller reference to a live TrainJob.
"""

from __future__ import annotations

from contracts import trainer as t
from contracts.kube import OwnerReference
from contracts.trainer import TrainJob
from contracts.values import name_of, namespace_of, uid_of
from planner.merge import Obj


def owner_reference(job: TrainJob) -> Obj:
    return {
        "apiVersion": t.API_VERSION,
        "kind": t.TRAINJOB_KIND,
        "name": name_of(job),
        "uid": uid_of(job),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owned_metadata(job: TrainJob, name: str) -> Obj:
    """A component's ``metadata``: ``name`` in the TrainJob's namespace, controlled by the TrainJob."""
    return {"name": name, "namespace": namespace_of(job), "ownerReferences": [owner_reference(job)]}


def owner_reference_struct(job: TrainJob) -> OwnerReference:
    """``owner_reference`` as the wire struct, for components built without a dict to convert."""
    return OwnerReference(
        api_version=t.API_VERSION,
        kind=t.TRAINJOB_KIND,
        name=name_of(job),
        uid=uid_of(job),
        controller=True,
        block_owner_deletion=True,
    )

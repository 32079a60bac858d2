"""What the lifecycle metrics say about one TrainJob, decided the same way wherever a stage counts.

The watcher reports how many TrainJobs are active and counts deletions; the applier counts creations and
the status changes it writes. Both label by namespace and runtime, so the label is computed here once.
"""

from __future__ import annotations

from contracts import trainer as t
from contracts.trainer import RuntimeRef, TrainJob, TrainJobSpec, TrainJobStatus
from contracts.values import or_default

NO_RUNTIME = "none"
"""The runtime label of a TrainJob without a runtime name (the API server requires one; old objects may lack it)."""

_NO_SPEC = TrainJobSpec()
_NO_REF = RuntimeRef()


def runtime_label(job: TrainJob) -> str:
    """The runtime's name, ``torch-distributed`` say: what a dashboard groups by (Trainer's proposal uses the kind)."""
    return or_default(or_default(or_default(job.spec, _NO_SPEC).runtime_ref, _NO_REF).name, "") or NO_RUNTIME


def is_finished(job: TrainJob) -> bool:
    """Complete or Failed: a TrainJob that is no longer active."""
    conditions = or_default(or_default(job.status, TrainJobStatus()).conditions, [])
    return any(c.type in (t.CONDITION_COMPLETE, t.CONDITION_FAILED) and c.status == "True" for c in conditions)


def is_ours(job: TrainJob) -> bool:
    """Managed by this controller (no ``managedBy``, or Trainer's): another controller's TrainJob is not counted."""
    return or_default(or_default(job.spec, _NO_SPEC).managed_by, t.MANAGED_BY_TRAINJOB_CONTROLLER) == (
        t.MANAGED_BY_TRAINJOB_CONTROLLER
    )

"""What Kubeflow Trainer v2.3.0 writes into a TrainJob's status, as facts to compare the pipeline with.

Read from Trainer's reconcile (``pkg/controller/trainjob_controller.go``) and its JobSet plugin's status
function (``pkg/runtime/framework/plugins/jobset``), and from JobSet v0.12.0's condition texts
(``pkg/constants``); written here in our own words, as literal values, so that these tests do not check
the pipeline against its own constants.

- ``conditions`` only ever holds ``Suspended``, ``Complete`` and ``Failed`` (for a job that builds). A job
  that was never suspended has no ``Suspended`` condition, so a running job has no conditions at all.
- ``Suspended``: True/``Suspended``/"TrainJob is suspended" while ``spec.suspend`` is true; after that it
  turns False/``Resumed``/"TrainJob is resumed" and stays.
- ``Complete`` and ``Failed`` are the JobSet's ``Completed`` and ``Failed`` conditions copied across with
  their reason, message and lastTransitionTime (JobSet sets no observedGeneration on them). A deadline
  sets ``Failed``/``DeadlineExceeded``/"TrainJob exceeded its active deadline" itself and deletes the JobSet.
- Conditions are kept in the order they were first set (apimachinery's SetStatusCondition appends).
- ``jobsStatus`` is the JobSet's ``replicatedJobsStatus``, entry for entry (name, ready, succeeded,
  failed, active, suspended), replaced on every reconcile while the JobSet exists and left as it was once
  a finished job's JobSet is gone. JobSet v0.12.0 builds that list from a Go map, so its order changes
  from one JobSet status write to the next; the tests compare it by name.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

SUSPENDED = {"type": "Suspended", "status": "True", "reason": "Suspended", "message": "TrainJob is suspended"}
RESUMED = {"type": "Suspended", "status": "False", "reason": "Resumed", "message": "TrainJob is resumed"}
DEADLINE_EXCEEDED = {
    "type": "Failed",
    "status": "True",
    "reason": "DeadlineExceeded",
    "message": "TrainJob exceeded its active deadline",
}
COMPLETE = {
    "type": "Complete",
    "status": "True",
    "reason": "AllJobsCompleted",
    "message": "jobset completed successfully",
}


def failed_jobs(first_failed_job: str) -> Obj:
    """JobSet's Failed condition when a child Job failed and the JobSet has no failurePolicy."""
    return {
        "type": "Failed",
        "status": "True",
        "reason": "FailedJobs",
        "message": f"jobset failed due to one or more job failures (first failed job: {first_failed_job})",
    }


def job_status(
    name: str, *, ready: int = 0, succeeded: int = 0, failed: int = 0, active: int = 0, suspended: int = 0
) -> Obj:
    """One ``jobsStatus`` entry: counts of the replicated job's Jobs, not of its pods."""
    return {
        "name": name,
        "ready": ready,
        "succeeded": succeeded,
        "failed": failed,
        "active": active,
        "suspended": suspended,
    }


def without_times(conditions: list[Obj]) -> list[Obj]:
    """Conditions without ``lastTransitionTime`` (checked separately), every other key kept."""
    return [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in conditions]


def status_shape(trainjob: Obj) -> Obj:
    """The TrainJob's status with the conditions' transition times left out: what the tests compare whole."""
    status: Obj = dict(trainjob.get("status") or {})
    if "conditions" in status:
        status["conditions"] = without_times(status["conditions"])
    if "jobsStatus" in status:
        status["jobsStatus"] = by_name(status["jobsStatus"])
    return status


def by_name(jobs: list[Obj]) -> list[Obj]:
    return sorted(jobs, key=lambda job: str(job.get("name")))


def expected(*conditions: Obj, jobs: list[Obj] | None = None) -> Obj:
    """A whole status as Trainer writes it (conditions without times); empty parts are absent, not empty."""
    status: Obj = {}
    if conditions:
        status["conditions"] = list(conditions)
    if jobs:
        status["jobsStatus"] = by_name(jobs)
    return status


def copied_from_jobset(trainjob: Obj, jobset: Obj) -> list[str]:
    """What differs between the TrainJob's Complete/Failed conditions and the JobSet's Completed/Failed ones
    (Trainer copies reason, message and lastTransitionTime as they are); empty when nothing does."""
    wrong = []
    js_conditions = {c["type"]: c for c in (jobset.get("status") or {}).get("conditions") or []}
    tj_conditions = {c["type"]: c for c in (trainjob.get("status") or {}).get("conditions") or []}
    for source, target in (("Completed", "Complete"), ("Failed", "Failed")):
        js_cond = js_conditions.get(source)
        if js_cond is None or js_cond.get("status") != "True":
            continue
        tj_cond = tj_conditions.get(target)
        if tj_cond is None:
            wrong.append(f"{target} missing, JobSet has {js_cond}")
            continue
        for key in ("status", "reason", "message", "lastTransitionTime", "observedGeneration"):
            if tj_cond.get(key) != js_cond.get(key):
                wrong.append(f"{target}.{key}: {tj_cond.get(key)!r} != JobSet's {js_cond.get(key)!r}")
    return wrong


def jobs_status_of(jobset: Obj) -> list[Obj]:
    """The JobSet's replicatedJobsStatus as Trainer copies it into ``jobsStatus``."""
    return by_name(
        [
            job_status(
                rj["name"],
                ready=rj.get("ready", 0),
                succeeded=rj.get("succeeded", 0),
                failed=rj.get("failed", 0),
                active=rj.get("active", 0),
                suspended=rj.get("suspended", 0),
            )
            for rj in (jobset.get("status") or {}).get("replicatedJobsStatus") or []
        ]
    )

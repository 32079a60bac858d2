"""TrainJob status as the planner wants it: conditions and ``jobsStatus``, written by Server-Side Apply.

Trainer v2.3.0 writes status with a JSON merge patch computed against a snapshot (upstream #3362); here it
is an apply configuration on the status subresource, owned by field manager ``trainer``. Because SSA
removes list entries a manager stops sending, the planner always sends the complete set of conditions it
wants, starting from the current ones, and keeps a condition's ``lastTransitionTime`` unless its status
flips — the rule of apimachinery's ``meta.SetStatusCondition``. The only clock is the event's
observation time, so the same event always yields the same status.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import msgspec

from contracts import trainer as t
from contracts.conditions import APPLIER_CONDITION_TYPES
from contracts.deadlines import deadline_of, parse_time
from contracts.jobset import JobSet
from contracts.messages import LifecycleChange, Transition
from contracts.trainer import TrainJob
from contracts.values import is_set, meta, or_default
from planner.runtime_info import builtins, spec_of

Obj = dict[str, Any]


def rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(int(ts), tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def find_condition(conditions: list[Obj], kind: str) -> Obj | None:
    return next((c for c in conditions if c.get("type") == kind), None)


def set_condition(conditions: list[Obj], new: Obj, now: float) -> None:
    existing = find_condition(conditions, new["type"])
    if existing is None:
        cond = dict(new)
        cond.setdefault("lastTransitionTime", rfc3339(now))
        conditions.append(cond)
        return
    if existing.get("status") != new["status"]:
        existing["status"] = new["status"]
        existing["lastTransitionTime"] = new.get("lastTransitionTime") or rfc3339(now)
    existing["reason"] = new.get("reason", "")
    existing["message"] = new.get("message", "")
    if "observedGeneration" in new:
        existing["observedGeneration"] = new["observedGeneration"]
    else:
        existing.pop("observedGeneration", None)


def is_true(conditions: list[Obj], kind: str) -> bool:
    cond = find_condition(conditions, kind)
    return cond is not None and cond.get("status") == "True"


def current_status(job: TrainJob) -> Obj:
    """The TrainJob's status without the conditions the applier owns under its own field manager.

    The planner neither sends those (sending them as ``trainer`` would make it co-own them, so the applier
    could never clear them) nor counts them as a difference from what it wants.
    """
    status: Obj = builtins(job.status) if is_set(job.status) else {}
    conditions = status.get("conditions")
    if conditions and any(c.get("type") in APPLIER_CONDITION_TYPES for c in conditions):
        status["conditions"] = [c for c in conditions if c.get("type") not in APPLIER_CONDITION_TYPES]
    return status


def is_finished(job: TrainJob) -> bool:
    if not is_set(job.status):
        return False
    conditions = current_status(job).get("conditions") or []
    return is_true(conditions, t.CONDITION_COMPLETE) or is_true(conditions, t.CONDITION_FAILED)


@dataclass(frozen=True)
class ConditionUpdate:
    type: str
    status: bool
    reason: str
    message: str
    only_if_present: bool = False
    """Only change the condition if the TrainJob already has it (e.g. to clear an earlier problem)."""


def condition(type_: str, status: bool, reason: str, message: str, *, only_if_present: bool = False) -> ConditionUpdate:
    return ConditionUpdate(type_, status, reason, message, only_if_present)


def deadline_exceeded(job: TrainJob, *, now: float) -> bool:
    """Is the job past its ``activeDeadlineSeconds`` at this observation?

    A job observed resuming (``spec.suspend`` no longer true, ``Suspended`` still True) is not: this plan
    turns ``Suspended`` False at ``now``, and the clock starts there. Trainer sets that condition in the
    same reconcile before it checks the deadline; counting from creation instead would fail at once every
    job resumed after a suspension longer than its deadline.
    """
    spec = spec_of(job)
    if not is_set(spec.active_deadline_seconds):
        return False  # the common case, without deadline_of's walk over the conditions
    if spec.suspend is not True and is_true(current_status(job).get("conditions") or [], t.CONDITION_SUSPENDED):
        return False
    deadline = deadline_of(job)
    return deadline is not None and now >= deadline


def desired_status(
    job: TrainJob, jobset: JobSet | None, *, now: float, updates: list[ConditionUpdate] | None = None
) -> Obj:
    """The status fields this planner owns: ``conditions`` and, once a JobSet exists, ``jobsStatus``."""
    current = current_status(job)
    current_conditions = current.get("conditions")
    conditions: list[Obj] = [dict(c) for c in current_conditions] if current_conditions else []
    if spec_of(job).suspend is True:
        set_condition(
            conditions,
            {
                "type": t.CONDITION_SUSPENDED,
                "status": "True",
                "reason": t.REASON_SUSPENDED,
                "message": t.MESSAGE_SUSPENDED,
            },
            now,
        )
    elif conditions and is_true(conditions, t.CONDITION_SUSPENDED):
        set_condition(
            conditions,
            {
                "type": t.CONDITION_SUSPENDED,
                "status": "False",
                "reason": t.REASON_RESUMED,
                "message": t.MESSAGE_RESUMED,
            },
            now,
        )

    status: Obj = {}
    if jobset is not None and is_set(jobset.status):
        js_status = builtins(jobset.status)
        js_conditions: list[Obj] = js_status.get("conditions") or []
        for source, target in (("Completed", t.CONDITION_COMPLETE), ("Failed", t.CONDITION_FAILED)):
            cond = find_condition(js_conditions, source)
            if cond is not None and cond.get("status") == "True":
                set_condition(conditions, {**cond, "type": target}, now)
        jobs_status = [
            {
                "name": rj.get("name", ""),
                "ready": rj.get("ready", 0),
                "succeeded": rj.get("succeeded", 0),
                "failed": rj.get("failed", 0),
                "active": rj.get("active", 0),
                "suspended": rj.get("suspended", 0),
            }
            for rj in js_status.get("replicatedJobsStatus") or []
        ]
        if jobs_status:
            status["jobsStatus"] = jobs_status
    for update in updates or ():
        if update.only_if_present and (not conditions or find_condition(conditions, update.type) is None):
            continue
        set_condition(
            conditions,
            {
                "type": update.type,
                "status": "True" if update.status else "False",
                "reason": update.reason,
                "message": update.message,
            },
            now,
        )
    if conditions:
        status["conditions"] = conditions
    return status


def status_changed(job: TrainJob, desired: Obj) -> bool:
    current = current_status(job)
    return any(current.get(key) != value for key, value in desired.items())


def only_counts_changed(job: TrainJob, desired: Obj) -> bool:
    """Whether ``desired`` differs from the TrainJob's status only in its Jobs' counts (``jobsStatus``).

    Such a status tells of pods starting, becoming ready or finishing while the conditions stay as they
    are; the applier may hold it back to write a running TrainJob's status at most once per interval
    (``applier.pacing``). A change of any condition is what a user or a controller waits on: never held.
    """
    current = current_status(job)
    return {key for key, value in desired.items() if current.get(key) != value} == {"jobsStatus"}


_LIFECYCLE: tuple[tuple[str, LifecycleChange], ...] = (
    (t.CONDITION_COMPLETE, "completed"),
    (t.CONDITION_FAILED, "failed"),
    (t.CONDITION_SUSPENDED, "suspended"),
)


def lifecycle_changes(job: TrainJob, desired: Obj) -> tuple[Transition, ...]:
    """The conditions ``desired`` turns True that the TrainJob, at the version planned from, does not have True.

    The status apply is conditional on that version, so only one write can make each change: that is why
    the applier may count what this returns when its write succeeds.
    """
    before = current_status(job).get("conditions") or []
    after: list[Obj] = desired.get("conditions") or []
    created = or_default(meta(job).creation_timestamp, "")
    changes = []
    for kind, change in _LIFECYCLE:
        if is_true(before, kind) or not is_true(after, kind):
            continue
        cond = find_condition(after, kind) or {}
        duration: float | msgspec.UnsetType = msgspec.UNSET
        if change != "suspended" and created and cond.get("lastTransitionTime"):
            duration = max(0.0, parse_time(cond["lastTransitionTime"]) - parse_time(created))
        changes.append(Transition(change=change, reason=str(cond.get("reason") or ""), duration_seconds=duration))
    return tuple(changes)

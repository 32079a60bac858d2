"""When a TrainJob's ``activeDeadlineSeconds`` runs out, computed from the TrainJob alone.

Both the planner (is the deadline past at this observation?) and the watcher (when must it look again?)
need the same instant, so it is computed in one place. Trainer counts from creation, or from the moment
the job was last resumed, and never while the job is suspended or finished.
"""

from __future__ import annotations

import datetime as dt

from contracts import trainer as t
from contracts.trainer import TrainJob, TrainJobSpec, TrainJobStatus
from contracts.values import meta, or_default


def parse_time(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def deadline_of(job: TrainJob) -> float | None:
    """Unix time at which the job exceeds its deadline, or ``None`` when no deadline is running."""
    spec = or_default(job.spec, TrainJobSpec())
    seconds = or_default(spec.active_deadline_seconds, 0)
    if seconds <= 0 or spec.suspend is True:
        return None
    conditions = or_default(or_default(job.status, TrainJobStatus()).conditions, [])
    start = or_default(meta(job).creation_timestamp, "")
    for cond in conditions:
        if cond.type in (t.CONDITION_COMPLETE, t.CONDITION_FAILED) and cond.status == "True":
            return None
        if cond.type == t.CONDITION_SUSPENDED and cond.status == "False":
            start = or_default(cond.last_transition_time, start)
    if not start:
        return None
    return parse_time(start) + seconds

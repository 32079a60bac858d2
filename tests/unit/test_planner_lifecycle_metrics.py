"""The pure parts of the TrainJob lifecycle metrics: which changes a status plan makes, and what is active.

What makes each change counted once is a conditional write on real servers (``tests/e2e/test_metrics.py``);
here: the planner names a change only when the condition turns True at the version it planned from, with
the duration from creation, and the watcher's gauge leaves out finished TrainJobs and other controllers'.
"""

from __future__ import annotations

import msgspec

from contracts import lifecycle
from contracts import messages as m
from contracts.jobset import JobSet
from contracts.trainer import TrainJob
from planner import status as status_rules
from planner.core import plan
from watcher import core as watcher_core

from .builders import suspended_condition, trainjob_dict

CREATED = "2023-11-14T22:00:00Z"
FINISHED = "2023-11-14T22:10:00Z"
NOW = 1_700_000_000.0  # 2023-11-14T22:13:20Z


def job(*, status: dict[str, object] | None = None, spec: dict[str, object] | None = None) -> TrainJob:
    body = trainjob_dict(
        name="mnist",
        namespace="team-a",
        runtime="torch-distributed",
        metadata={"creationTimestamp": CREATED, "resourceVersion": "7"},
        spec=spec,
        status=status,
    )
    return msgspec.convert(body, TrainJob)


def jobset_status(condition: str, reason: str) -> dict[str, object]:
    cond = {"type": condition, "status": "True", "reason": reason, "message": "m", "lastTransitionTime": FINISHED}
    return {"status": {"conditions": [cond]}}


def desired(trainjob: TrainJob, jobset: dict[str, object] | None = None) -> dict[str, object]:
    js = msgspec.convert({"metadata": {"name": "mnist"}, **(jobset or {})}, JobSet) if jobset else None
    return status_rules.desired_status(trainjob, js, now=NOW)


def test_a_jobset_that_completes_makes_one_completed_change_with_the_time_since_creation() -> None:
    trainjob = job()
    completed = desired(trainjob, jobset_status("Completed", "AllJobsCompleted"))
    changes = status_rules.lifecycle_changes(trainjob, completed)
    assert changes == (m.Transition(change="completed", reason="AllJobsCompleted", duration_seconds=600.0),)


def test_a_failure_carries_its_reason() -> None:
    trainjob = job()
    changes = status_rules.lifecycle_changes(trainjob, desired(trainjob, jobset_status("Failed", "FailedJobs")))
    assert changes == (m.Transition(change="failed", reason="FailedJobs", duration_seconds=600.0),)


def test_a_condition_already_true_at_the_planned_version_is_no_change() -> None:
    done = {"type": "Complete", "status": "True", "reason": "AllJobsCompleted", "lastTransitionTime": FINISHED}
    trainjob = job(status={"conditions": [done]})
    assert status_rules.lifecycle_changes(trainjob, desired(trainjob, jobset_status("Completed", "x"))) == ()


def test_suspending_is_a_change_and_resuming_is_not() -> None:
    trainjob = job(spec={"suspend": True})
    assert status_rules.lifecycle_changes(trainjob, desired(trainjob)) == (
        m.Transition(change="suspended", reason="Suspended"),
    )
    resuming = job(spec={"suspend": False}, status={"conditions": [suspended_condition(True, CREATED)]})
    assert status_rules.lifecycle_changes(resuming, desired(resuming)) == ()
    again = job(spec={"suspend": True}, status={"conditions": [suspended_condition(False, FINISHED)]})
    assert [c.change for c in status_rules.lifecycle_changes(again, desired(again))] == ["suspended"]


def test_the_status_message_of_a_plan_carries_the_changes() -> None:
    trainjob = job(spec={"suspend": True})
    event = m.TrainJobObserved(trainjob=trainjob, runtime=None, runtime_source="none", observed_at=NOW)
    statuses = [a for a in plan(event, source_seq=1).applies if isinstance(a, m.ApplyTrainJobStatus)]
    assert [t.change for s in statuses for t in s.transitions] == ["suspended"]


def test_active_leaves_out_finished_trainjobs_and_other_controllers() -> None:
    failed = {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "lastTransitionTime": FINISHED}
    running = job()
    finished = job(status={"conditions": [failed]})
    foreign = job(spec={"managedBy": "kueue.x-k8s.io/multikueue"})
    assert watcher_core.active_label(running) == ("team-a", "torch-distributed")
    assert watcher_core.active_label(finished) is None
    assert watcher_core.active_label(foreign) is None
    labels = [watcher_core.active_label(j) for j in (running, running, finished, foreign)]
    assert watcher_core.active_counts(labels) == {("team-a", "torch-distributed"): 2}


def test_the_runtime_label_is_the_runtime_name() -> None:
    assert lifecycle.runtime_label(job()) == "torch-distributed"
    assert lifecycle.runtime_label(msgspec.convert({"metadata": {"name": "x"}}, TrainJob)) == lifecycle.NO_RUNTIME

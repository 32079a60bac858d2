"""Reconcile rules around the plugins: snapshots, unsupported runtimes, deadlines, and upstream bug fixes."""

from __future__ import annotations

from typing import Any

import msgspec
import yaml

from contracts import messages as m
from planner.core import plan

from .builders import (
    OBSERVED_AT,
    Obj,
    applies_of,
    job_patch,
    replicated_job,
    runtime_dict,
    runtime_patch,
    suspended_condition,
    trainjob_dict,
    trainjob_observed,
)

T0 = OBSERVED_AT  # 2023-11-14T22:13:20Z


def runtime() -> Obj:
    return runtime_dict(
        [replicated_job("node", [{"name": "node", "image": "img"}], ancestor="trainer", replicas=1)],
        name="torch",
        metadata={"resourceVersion": "3", "managedFields": [{"manager": "kubectl"}]},
        ml_policy={"numNodes": 1, "torch": {}},
    )


def trainjob(spec: Obj | None = None, status: Obj | None = None, created: str = "2023-11-14T22:00:00Z") -> Obj:
    return trainjob_dict(
        name="tj",
        namespace="ns",
        uid="uid-1",
        runtime="torch",
        spec={"trainer": {"numNodes": 2}, **(spec or {})},
        metadata={"creationTimestamp": created},
        status=status,
    )


def event(
    job: Obj,
    rt: Obj | None = None,
    *,
    source: m.RuntimeSource = "live",
    js: Obj | None = None,
    error: str = "",
    now: float = T0,
) -> m.TrainJobObserved:
    return trainjob_observed(job, rt, runtime_source=source, runtime_error=error, jobset=js, observed_at=now)


def of(p: m.Plan, kind: type[Any]) -> list[Any]:
    return applies_of(p, kind)


def conditions(p: m.Plan) -> list[Obj]:
    (status,) = of(p, m.ApplyTrainJobStatus)
    found: list[Obj] = msgspec.to_builtins(status.object)["status"]["conditions"]
    return found


def test_first_plan_records_the_runtime_snapshot_once() -> None:
    p = plan(event(trainjob(), runtime()), source_seq=1)
    (snapshot,) = of(p, m.ApplyConfigMap)
    assert snapshot.policy == "if-absent"
    assert snapshot.target.name == "tj-runtime-snapshot"
    body = msgspec.to_builtins(snapshot.object)
    assert body["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    recorded = yaml.safe_load(body["data"]["runtime"])
    assert recorded["kind"] == "ClusterTrainingRuntime"
    assert recorded["metadata"]["name"] == "torch"
    assert "managedFields" not in recorded["metadata"]
    assert recorded["spec"] == runtime()["spec"]
    # A plan from the snapshot does not write it again.
    assert of(plan(event(trainjob(), runtime(), source="snapshot"), source_seq=2), m.ApplyConfigMap) == []


def test_unsupported_runtime_kind_fails_with_trainers_reason() -> None:
    job = trainjob({"runtimeRef": {"name": "x", "apiGroup": "example.com", "kind": "MyRuntime"}})
    p = plan(event(job, None, source="none"), source_seq=1)
    assert of(p, m.ApplyJobSet) == []
    (failed,) = conditions(p)
    assert (failed["type"], failed["status"], failed["reason"], failed["message"]) == (
        "Failed",
        "True",
        "TrainingRuntimeNotSupported",
        "unsupported runtime: MyRuntime.example.com",
    )


def test_invalid_snapshot_is_reported_and_nothing_is_built() -> None:
    p = plan(event(trainjob(), None, source="none", error="invalid runtime snapshot: owned by another"), source_seq=1)
    assert of(p, m.ApplyJobSet) == []
    (cond,) = conditions(p)
    assert (cond["type"], cond["status"], cond["reason"]) == ("ResourcesCreated", "False", "InvalidRuntimeSnapshot")


def test_problem_condition_turns_true_once_resolved() -> None:
    missing = plan(event(trainjob(), None, source="none"), source_seq=1)
    job = trainjob(status={"conditions": conditions(missing)})
    p = plan(event(job, runtime(), source="snapshot", now=T0 + 60), source_seq=2)
    assert len(of(p, m.ApplyJobSet)) == 1
    (cond,) = conditions(p)
    assert (cond["type"], cond["status"], cond["reason"]) == ("ResourcesCreated", "True", "ResourcesCreated")


def test_healthy_job_gets_no_extra_condition() -> None:
    p = plan(event(trainjob(), runtime(), source="snapshot"), source_seq=1)
    assert of(p, m.ApplyTrainJobStatus) == []


def test_deadline_exceeded_fails_the_job_and_deletes_the_jobset() -> None:
    job = trainjob({"activeDeadlineSeconds": 900}, created="2023-11-14T22:00:00Z")  # due at 22:15:00
    before = plan(event(job, runtime(), source="snapshot", now=T0 - 60), source_seq=1)
    assert of(before, m.DeleteComponent) == []
    after = plan(event(job, runtime(), source="snapshot", now=T0 + 120), source_seq=2)  # 22:15:20
    (delete,) = of(after, m.DeleteComponent)
    assert (delete.target.kind, delete.target.name) == ("JobSet", "tj")
    assert of(after, m.ApplyJobSet) == []
    (failed,) = conditions(after)
    assert (failed["type"], failed["reason"], failed["message"]) == (
        "Failed",
        "DeadlineExceeded",
        "TrainJob exceeded its active deadline",
    )


def test_deadline_counts_from_the_resume() -> None:
    resumed = suspended_condition(False, "2023-11-14T22:12:00Z")
    job = trainjob({"activeDeadlineSeconds": 600}, status={"conditions": [resumed]})
    assert of(plan(event(job, runtime(), source="snapshot"), source_seq=1), m.DeleteComponent) == []


def test_a_job_resumed_after_a_long_suspension_starts_its_deadline_at_the_resume() -> None:
    """Created at 22:00, deadline 600 s, suspended until now (22:13:20): the resume is not a failure, the
    plan turns Suspended False/Resumed and keeps the JobSet; the deadline then runs from 22:13:20."""
    still_suspended = suspended_condition(True, "2023-11-14T22:00:00Z")
    job = trainjob({"activeDeadlineSeconds": 600, "suspend": False}, status={"conditions": [still_suspended]})
    resumed = plan(event(job, runtime(), source="snapshot"), source_seq=1)
    assert of(resumed, m.DeleteComponent) == []
    (suspended,) = conditions(resumed)
    assert (suspended["status"], suspended["reason"], suspended["lastTransitionTime"]) == (
        "False",
        "Resumed",
        "2023-11-14T22:13:20Z",
    )
    after = trainjob({"activeDeadlineSeconds": 600, "suspend": False}, status={"conditions": [suspended]})
    assert of(plan(event(after, runtime(), source="snapshot", now=T0 + 599), source_seq=2), m.DeleteComponent) == []
    assert len(of(plan(event(after, runtime(), source="snapshot", now=T0 + 600), source_seq=3), m.DeleteComponent)) == 1


def test_failed_job_is_never_rebuilt() -> None:
    failed = {
        "type": "Failed",
        "status": "True",
        "reason": "FailedJobs",
        "message": "x",
        "lastTransitionTime": "2023-11-14T22:00:00Z",
    }
    p = plan(event(trainjob(status={"conditions": [failed]}), runtime(), source="snapshot"), source_seq=1)
    assert p.applies == ()


def test_resume_keeps_fields_jobset_would_refuse_to_change() -> None:
    """Upstream #3008: the resumed apply must pass JobSet's update rule."""
    live_rt = runtime()
    live = plan(event(trainjob({"suspend": True}), live_rt, source="snapshot"), source_seq=1)
    (live_js,) = of(live, m.ApplyJobSet)
    live_obj = msgspec.to_builtins(live_js.object)
    live_obj["metadata"]["resourceVersion"] = "9"
    patches = [
        runtime_patch(
            "example.com/ops",
            replicated_jobs=[
                job_patch(
                    "node",
                    pod_spec={"nodeSelector": {"pool": "a"}, "volumes": [{"name": "scratch", "emptyDir": {}}]},
                )
            ],
        )
    ]
    job = trainjob({"suspend": False, "runtimePatches": patches})
    p = plan(event(job, live_rt, source="snapshot", js=live_obj), source_seq=2)
    (js,) = of(p, m.ApplyJobSet)
    pod_spec = msgspec.to_builtins(js.object)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod_spec["nodeSelector"] == {"pool": "a"}
    assert "volumes" not in pod_spec
    assert msgspec.to_builtins(js.object)["spec"]["suspend"] is False
    (cond,) = [c for c in conditions(p) if c["type"] == "ResourcesCreated"]
    assert cond["reason"] == "ImmutableFieldsKept"
    assert "spec.replicatedJobs[0].template.spec.template.spec.volumes" in cond["message"]

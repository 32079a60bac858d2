"""``watcher.core``: which TrainJob changes are only the pipeline's own status write, and when one may go unplanned."""

from __future__ import annotations

from typing import Any

import msgspec

from contracts.trainer import TrainJob
from watcher import core

from .builders import Obj

COMPLETE = {
    "type": "Complete",
    "status": "True",
    "reason": "JobsCompleted",
    "message": "jobs completed",
    "lastTransitionTime": "2026-12-05T10:00:00Z",
}
NODE_RUNNING = {"name": "node", "active": 2, "ready": 2, "succeeded": 0, "failed": 0, "suspended": 0}
NODE_DONE = {"name": "node", "active": 0, "ready": 0, "succeeded": 2, "failed": 0, "suspended": 0}


def _condition_fields(
    *types: str, fields: tuple[str, ...] = ("lastTransitionTime", "message", "reason", "status")
) -> Obj:
    return {f'k:{{"type":"{kind}"}}': {".": {}, "f:type": {}, **{f"f:{name}": {} for name in fields}} for kind in types}


def _jobs_fields(*names: str) -> Obj:
    counters = ("active", "failed", "ready", "succeeded", "suspended")
    return {f'k:{{"name":"{name}"}}': {".": {}, "f:name": {}, **{f"f:{c}": {} for c in counters}} for name in names}


def _entry(manager: str, status_fields: Obj, *, operation: str = "Apply", subresource: str = "status") -> Obj:
    return {
        "manager": manager,
        "operation": operation,
        "subresource": subresource,
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:status": status_fields},
    }


def job(
    status: Obj | None,
    *,
    rv: str,
    managed: list[Obj] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> TrainJob:
    metadata: dict[str, Any] = {"name": "tj", "namespace": "ns", "uid": "u-1", "resourceVersion": rv, "generation": 1}
    if managed is not None:
        metadata["managedFields"] = managed
    if labels is not None:
        metadata["labels"] = labels
    if annotations is not None:
        metadata["annotations"] = annotations
    body: Obj = {"metadata": metadata, "spec": {"runtimeRef": {"name": "torch"}}}
    if status is not None:
        body["status"] = status
    return msgspec.convert(body, TrainJob)


RUNNING = {"jobsStatus": [NODE_RUNNING]}
DONE = {"conditions": [COMPLETE], "jobsStatus": [NODE_DONE]}
OURS_DONE = _entry("trainer", {"f:conditions": _condition_fields("Complete"), "f:jobsStatus": _jobs_fields("node")})


def test_a_status_the_pipeline_wrote_itself_is_an_echo() -> None:
    assert core.own_status_write(job(RUNNING, rv="7"), job(DONE, rv="8", managed=[OURS_DONE]))


def test_the_first_status_written_is_an_echo_too() -> None:
    first = _entry("trainer", {"f:jobsStatus": _jobs_fields("node")})
    assert core.own_status_write(job(None, rv="7"), job(RUNNING, rv="8", managed=[first]))


def test_a_change_outside_the_status_is_not_an_echo() -> None:
    assert not core.own_status_write(
        job(RUNNING, rv="7"), job(DONE, rv="8", managed=[OURS_DONE], labels={"team": "vision"})
    )


def test_kubectls_last_applied_annotation_is_compared_as_the_cache_keeps_it() -> None:
    """The watcher's cached copy has no last-applied annotation: that alone is no difference."""
    kubectl = {"kubectl.kubernetes.io/last-applied-configuration": "{}"}
    assert core.own_status_write(job(RUNNING, rv="7"), job(DONE, rv="8", managed=[OURS_DONE], annotations=kubectl))


def test_a_field_another_writer_took_over_is_not_an_echo() -> None:
    """An update that changes a condition's message moves that field to its own manager."""
    ours = _entry(
        "trainer",
        {
            "f:conditions": _condition_fields("Complete", fields=("lastTransitionTime", "reason", "status")),
            "f:jobsStatus": _jobs_fields("node"),
        },
    )
    theirs = _entry("kubectl-edit", {"f:conditions": {'k:{"type":"Complete"}': {"f:message": {}}}}, operation="Update")
    edited = {"conditions": [{**COMPLETE, "message": "edited by hand"}], "jobsStatus": [NODE_DONE]}
    assert not core.own_status_write(job(DONE, rv="8"), job(edited, rv="9", managed=[ours, theirs]))


def test_status_another_manager_owns_is_not_an_echo() -> None:
    progress = {**DONE, "trainerStatus": {"progressPercentage": 40}}
    status_server = _entry("trainer-status", {"f:trainerStatus": {".": {}, "f:progressPercentage": {}}})
    assert not core.own_status_write(job(DONE, rv="8"), job(progress, rv="9", managed=[OURS_DONE, status_server]))


def test_our_write_beside_another_writers_in_one_step_is_not_an_echo() -> None:
    """Two writes seen as one change (a list after a watch ended) are judged together: theirs shows."""
    progress = {**DONE, "trainerStatus": {"progressPercentage": 40}}
    status_server = _entry("trainer-status", {"f:trainerStatus": {".": {}, "f:progressPercentage": {}}})
    assert not core.own_status_write(job(RUNNING, rv="7"), job(progress, rv="9", managed=[OURS_DONE, status_server]))


def test_a_condition_that_went_away_is_not_an_echo() -> None:
    suspended = {"type": "Suspended", "status": "True", "reason": "Suspended", "message": "m"}
    before = {"conditions": [suspended, COMPLETE], "jobsStatus": [NODE_DONE]}
    assert not core.own_status_write(job(before, rv="7"), job(DONE, rv="8", managed=[OURS_DONE]))


def test_a_list_entry_the_fields_do_not_name_is_not_an_echo() -> None:
    two = {"conditions": [COMPLETE], "jobsStatus": [NODE_DONE, {**NODE_DONE, "name": "launcher"}]}
    assert not core.own_status_write(job(RUNNING, rv="7"), job(two, rv="8", managed=[OURS_DONE]))


def test_only_the_pipelines_apply_on_the_status_counts() -> None:
    as_update = _entry("trainer", OURS_DONE["fieldsV1"]["f:status"], operation="Update")
    on_the_object = _entry("trainer", OURS_DONE["fieldsV1"]["f:status"], subresource="")
    other = _entry("someone", OURS_DONE["fieldsV1"]["f:status"])
    for entry in (as_update, on_the_object, other):
        assert not core.own_status_write(job(RUNNING, rv="7"), job(DONE, rv="8", managed=[entry]))


def test_an_echo_after_components_and_jobset_changes_is_planned_from_its_status() -> None:
    """The usual run: the TrainJob, its components made, its JobSet moving, all at one TrainJob version."""
    guard = core.EchoGuard()
    key = ("ns", "tj")
    for cause in ("TrainJob ADDED", "ConfigMap ADDED + JobSet ADDED", "JobSet MODIFIED", "Secret DELETED"):
        guard.published(key, "7", cause)
    assert guard.may_skip(key)


def test_a_runtime_change_after_the_first_observation_has_the_echo_planned_whole() -> None:
    """The plan from the runtime's change may have decided other conditions, and its status write was the
    one refused as stale: only a whole plan of the echo brings them back."""
    for cause in (
        "ClusterTrainingRuntime MODIFIED",
        "TrainingRuntime ADDED",
        "ConfigMap MODIFIED",
        "ConfigMap DELETED + JobSet MODIFIED",
        "deadline reached",
        "TrainJob RESYNC",
    ):
        guard = core.EchoGuard()
        key = ("ns", "tj")
        guard.published(key, "7", "TrainJob MODIFIED")
        guard.published(key, "7", cause)
        assert not guard.may_skip(key), cause


def test_the_first_observation_at_a_version_starts_over() -> None:
    guard = core.EchoGuard()
    key = ("ns", "tj")
    guard.published(key, "7", "TrainJob MODIFIED")
    guard.published(key, "7", "ClusterTrainingRuntime MODIFIED")
    guard.published(key, "8", "TrainJob MODIFIED")  # whatever caused it, its own plan had the newest decision
    assert guard.may_skip(key)
    guard.published(key, "8", "deadline reached")
    guard.forget(key)
    assert guard.may_skip(key)


def test_a_whole_observation_after_an_echo_of_the_same_objects_is_not_its_duplicate() -> None:
    """The differential's jobset-deleted case: the echo of the pipeline's status write already saw the JobSet
    gone and was planned from its status alone; the JobSet's own DELETED observation, of the same objects,
    must still go out to be planned whole, or the JobSet is never made again."""
    guard = core.EchoGuard()
    key = ("ns", "tj")
    assert guard.message_id(key, "u/7;js=3", echo=False) == "u/7;js=3"
    echo = guard.message_id(key, "u/8", echo=True)
    deleted = guard.message_id(key, "u/8", echo=False)
    assert echo != deleted and deleted == "u/8"


def test_an_echo_of_what_already_went_out_whole_keeps_its_id_so_the_stream_drops_it() -> None:
    """A JobSet's change observed at the TrainJob version of the pipeline's own write, then that write's echo:
    the echo carries nothing new, and costs no plan (tests/budgets counts it)."""
    guard = core.EchoGuard()
    key = ("ns", "tj")
    assert guard.message_id(key, "u/8;js=4", echo=False) == "u/8;js=4"
    assert guard.message_id(key, "u/8;js=4", echo=True) == "u/8;js=4"
    guard.forget(key)
    assert guard.message_id(key, "u/8;js=4", echo=True) == "u/8;js=4;echo"

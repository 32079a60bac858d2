"""The history server's owner-facing story and the progress it keeps per TrainJob, as pure functions: states
with Trainer's reasons and their durations, a plain sentence per record, the tone a record is drawn in,
the newest progress and the stalled rule, and the CSV a spreadsheet opens safely."""

from __future__ import annotations

import csv
import io
from typing import Any

import msgspec

from contracts import subjects
from contracts.messages import ObjectKey, TrainJobObserved, encode
from contracts.progress import ProgressReported, encode_progress
from contracts.trainer import Metric, TrainerStatus, TrainJob
from history_server import story
from history_server.index import HistoryIndex
from plumbing.bus_history import StoredMessage
from tjpipe import history_tools
from tjpipe.history_tools import ProgressPoint, TimelineEntry, trainjob_state

COMPLETE = {"type": "Complete", "status": "True", "reason": "AllJobsCompleted", "message": "jobset completed"}


def _event(
    time: float, state: str, *, cause: str = "TrainJob MODIFIED", changed: tuple[str, ...] = (), **more: Any
) -> TimelineEntry:
    detail = {"cause": cause, "resourceVersion": "7", "changed": list(changed), "state": state, **more}
    return TimelineEntry(time, "TJ_EVENTS", int(time), "event", f"{cause} (TrainJob rv 7, runtime from live)", detail)


def _result(time: float, action: str, reason: str = "", subresource: str | None = None) -> TimelineEntry:
    target = {"api_version": "v1", "kind": "TrainJob" if subresource else "JobSet", "namespace": "ns", "name": "a"}
    target["subresource"] = subresource  # type: ignore[assignment]
    detail = {"action": action, "reason": reason, "target": target}
    return TimelineEntry(time, "TJ_RESULTS", int(time), "result", f"{action} JobSet ns/a", detail)


def test_trainjob_state_reads_trainers_conditions_first_then_suspension_then_active_jobs() -> None:
    assert trainjob_state({}) == ("Created", "", "")
    assert trainjob_state({"status": {"jobsStatus": [{"active": 2}]}}) == ("Running", "", "")
    assert trainjob_state({"spec": {"suspend": True}, "status": {"jobsStatus": [{"active": 2}]}})[0] == "Suspended"
    failed = {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "too long"}
    assert trainjob_state({"status": {"conditions": [COMPLETE]}}) == (
        "Complete",
        "AllJobsCompleted",
        "jobset completed",
    )
    assert trainjob_state({"status": {"conditions": [COMPLETE, failed]}}) == ("Failed", "DeadlineExceeded", "too long")
    assert trainjob_state({"status": {"conditions": [{**COMPLETE, "status": "False"}]}})[0] == "Created"


def test_phases_last_from_one_state_to_the_next_with_the_reason_that_arrived() -> None:
    entries = [
        _event(10, "Created", cause="TrainJob ADDED"),
        _event(12, "Running", changed=("status.jobsStatus",)),
        _event(13, "Running", changed=("status.trainerStatus",)),
        _event(20, "Suspended", reason="Suspended"),
        _event(25, "Running"),
        _event(40, "Complete", reason="AllJobsCompleted", message="jobset completed"),
    ]
    found = story.phases(entries)
    assert [(p.state, p.start, p.end) for p in found] == [
        ("Created", 10, 12),
        ("Running", 12, 20),
        ("Suspended", 20, 25),
        ("Running", 25, 40),
        ("Complete", 40, None),
    ]
    assert found[-1].to_json()["reason"] == "AllJobsCompleted" and found[-1].to_json()["seconds"] is None
    assert story.running_seconds(found, now=100) == 8 + 15
    assert story.texts(entries) == [
        "Created",
        "Running",
        "Updated training progress",
        "Suspended",
        "Resumed and running",
        "Complete — AllJobsCompleted: jobset completed",
    ]


def test_records_read_as_sentences_and_a_skipped_write_is_not_a_success() -> None:
    stale = _result(3, "skipped", "stale status: the TrainJob changed", subresource="status")
    entries = [
        _event(1, "Running", cause="JobSet MODIFIED", changed=("spec.trainer.numNodes",)),
        _event(2, "Running", cause="JobSet MODIFIED + ConfigMap ADDED"),
        TimelineEntry(
            2.5, "TJ_APPLY", 3, "plan", "jobset → JobSet ns/a (policy always, from event 1)", {"target": "JobSet ns/a"}
        ),
        stale,
        _result(4, "created"),
        _result(5, "failed", "422 invalid"),
        TimelineEntry(6, "TJ_DLQ", 1, "dead-letter", "applier: permanent: x", {"stage": "applier", "error": "x"}),
    ]
    assert story.texts(entries)[1:] == [
        "ConfigMap and JobSet changed",
        "Planned JobSet a",
        "Left the TrainJob's status as it was: stale status: the TrainJob changed",
        "Created JobSet a",
        "Could not write JobSet a: 422 invalid",
        "The applier gave up: x",
    ]
    assert story.texts(entries)[0] == "First seen: Running"
    assert [story.tone(e) for e in entries[3:]] == ["skipped", "ok", "failed", "failed"]
    assert story.counts(entries) == {"event": 2, "plan": 1, "result": 3, "dead-letter": 1}


def _progress(seq: int, received: float, percent: int, **metrics: str) -> StoredMessage:
    record = ProgressReported(
        trainjob=ObjectKey(namespace="ns", name="a"),
        trainjob_uid="u1",
        pod="a-node-0",
        trainer_status=TrainerStatus(
            progress_percentage=percent,
            metrics=[Metric(name=k, value=v) for k, v in metrics.items()],
            last_updated_time="2026-01-01T00:00:00Z",
        ),
        received_at=received,
    )
    data = encode_progress(record)
    return StoredMessage(
        stream="TJ_PROGRESS",
        seq=seq,
        subject=subjects.progress_subject("ns", "a"),
        data=data,
        headers={},
        time=received,
    )


def _running(seq: int, time: float) -> StoredMessage:
    job = msgspec.convert(
        {"metadata": {"name": "a", "namespace": "ns", "uid": "u1"}, "status": {"jobsStatus": [{"active": 1}]}}, TrainJob
    )
    data = encode(TrainJobObserved(trainjob=job, observed_at=time))
    return StoredMessage(
        stream="TJ_EVENTS", seq=seq, subject=subjects.event_subject("ns", "a"), data=data, headers={}, time=time
    )


def test_the_index_keeps_the_newest_progress_and_calls_a_quiet_running_job_stalled() -> None:
    index = HistoryIndex()
    index.add_event(_running(1, 100.0))
    index.add_progress(_progress(1, 110.0, 10, loss="2.0"))
    index.add_progress(_progress(2, 120.0, 20, loss="1.5", accuracy="0.4"))
    index.add_progress(
        StoredMessage(
            stream="TJ_PROGRESS", seq=3, subject=subjects.progress_subject("ns", "a"), data=b"{", headers={}, time=121.0
        )
    )
    summary = index.get("ns", "a")
    assert summary is not None and summary.progress is not None
    assert (summary.progress.percentage, summary.progress.metrics, summary.progress.updates) == (
        20,
        {"loss": "1.5", "accuracy": "0.4"},
        2,
    )
    assert index.undecodable == 1
    assert summary.stalled_for(now=125.0, after=10.0) is None
    assert summary.stalled_for(now=131.0, after=10.0) == 11.0
    assert summary.stalled_for(now=131.0, after=0.0) is None  # 0: never
    listed = summary.to_json(131.0, 10.0)
    assert listed["stalled"] is True and listed["stalledSeconds"] == 11.0 and listed["progress"]["percentage"] == 20
    # Kept by its progress records too: pruned only once none of them is left either.
    assert index.prune(first_event_seq=2, first_dead_letter_seq=1, first_progress_seq=2) == 0
    assert index.prune(first_event_seq=2, first_dead_letter_seq=1, first_progress_seq=3) == 1


def test_a_job_that_never_reported_or_is_not_running_is_not_stalled() -> None:
    index = HistoryIndex()
    index.add_event(_running(1, 100.0))
    summary = index.get("ns", "a")
    assert summary is not None and summary.stalled_for(now=10_000.0, after=10.0) is None
    index.add_progress(_progress(1, 110.0, 10))
    summary.state = "Complete"
    assert summary.stalled_for(now=10_000.0, after=10.0) is None


def test_the_csv_has_one_column_per_metric_and_no_formula() -> None:
    points = [
        ProgressPoint(
            time=0.5,
            seq=1,
            pod="=pod",
            last_updated="",
            percentage=10,
            remaining_seconds=None,
            metrics={"loss": "-0.5"},
        ),
        ProgressPoint(
            time=1.0, seq=2, pod="p", last_updated="", percentage=None, remaining_seconds=9, metrics={"=x": "@SUM(A1)"}
        ),
    ]
    rows = list(csv.reader(io.StringIO(history_tools.progress_csv(points))))
    assert rows[0][5:] == ["'=x", "loss"]
    assert rows[1] == ["1970-01-01T00:00:00.500Z", "", "'=pod", "10", "", "", "-0.5"]
    assert rows[2] == ["1970-01-01T00:00:01.000Z", "", "p", "", "9", "'@SUM(A1)", ""]


def test_a_job_whose_pods_finished_before_trainer_called_it_complete_is_not_waiting_again() -> None:
    finishing = {"status": {"jobsStatus": [{"name": "node", "active": 0, "ready": 0, "succeeded": 2}]}}
    assert trainjob_state(finishing)[0] == "Running"
    assert trainjob_state({"status": {"jobsStatus": [{"active": 0, "failed": 1}]}})[0] == "Running"
    entries = [
        _event(10, "Created", cause="TrainJob ADDED"),
        _event(12, "Running", changed=("status.jobsStatus",)),
        _event(30, "Created", changed=("status.jobsStatus",)),  # an older status, or any read as Created
        _event(30.083, "Complete", reason="AllJobsCompleted"),
        _event(31, "Created"),  # an echo after the end
    ]
    assert [p.state for p in story.phases(entries)] == ["Created", "Running", "Complete"]
    assert "Waiting for its pods" not in story.texts(entries)
    resumed = [_event(10, "Running"), _event(20, "Suspended"), _event(25, "Created")]
    assert [p.state for p in story.phases(resumed)] == ["Running", "Suspended", "Created"]

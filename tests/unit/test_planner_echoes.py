"""``planner.core.plan`` of an echo: the pipeline's own status write is planned from its status alone."""

from __future__ import annotations

import msgspec

from contracts import messages as m
from contracts.jobset import JobSet
from planner.core import plan

from .builders import replicated_job, runtime_dict, suspended_condition, trainjob_dict, trainjob_observed


def _suspended_event() -> m.TrainJobObserved:
    """A suspended TrainJob just after its Suspended condition was written: the case where an echo planned
    as any other observation would send its JobSet again (a suspended JobSet is re-planned from the live one)."""
    job = trainjob_dict(
        name="tj",
        namespace="ns",
        uid="u-1",
        runtime="torch",
        spec={"suspend": True},
        metadata={"resourceVersion": "8"},
        status={"conditions": [suspended_condition(True, "2026-12-05T10:00:00Z")]},
    )
    return trainjob_observed(
        job,
        runtime_dict([replicated_job("node", [{"name": "node", "image": "pytorch"}])], name="torch"),
        cause="TrainJob MODIFIED",
    )


def test_an_echo_is_planned_to_nothing_when_the_status_stands() -> None:
    echo = msgspec.structs.replace(_suspended_event(), echo=True)
    result = plan(echo, source_seq=9)
    assert result == m.Plan(trainjob=m.ObjectKey(namespace="ns", name="tj"), trainjob_uid="u-1", source_seq=9)


def test_the_same_observation_unmarked_is_planned_whole() -> None:
    """What the mark saves: without it the components are planned (and read by the applier) again."""
    result = plan(_suspended_event(), source_seq=9)
    assert {type(a) for a in result.applies} >= {m.ApplyJobSet}


def test_an_echo_carrying_a_newer_jobset_status_plans_that_status_only() -> None:
    """A JobSet change planned from the older TrainJob version had its status refused as stale: the echo of
    the write that won brings the newer counts back, without the components."""
    event = _suspended_event()
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "tj", "namespace": "ns", "resourceVersion": "30"},
        "spec": {"suspend": True},
        "status": {"replicatedJobsStatus": [{"name": "node", "suspended": 1}]},
    }
    echo = msgspec.structs.replace(event, echo=True, jobset=msgspec.convert(jobset, JobSet))
    result = plan(echo, source_seq=9)
    (status,) = result.applies
    assert isinstance(status, m.ApplyTrainJobStatus)
    assert msgspec.to_builtins(status.object)["status"]["jobsStatus"] == [
        {"name": "node", "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 1}
    ]
    assert status.paced  # the counts alone changed: the applier may hold it for its turn


def test_an_older_watchers_event_reads_as_unmarked() -> None:
    """An older watcher's event has no ``echo``: it is planned as before. (An older planner ignores the field,
    as msgspec ignores fields a type does not know; tests/wire runs the older services themselves.)"""
    event = msgspec.structs.replace(_suspended_event(), echo=True)
    older = msgspec.json.decode(m.encode(event))
    del older["echo"]
    assert m.decode_event(msgspec.json.encode(older)) == _suspended_event()

"""The pipeline's own status writes on real servers: recorded in the history, planned to nothing, and never
mistaken for another writer's change made beside them.

The watcher tells an echo from the TrainJob's ``managedFields`` as the API server sends them
(``watcher.core.own_status_write``); these tests write the way other writers do (a merge patch of the status,
a change of the spec) at the moment the pipeline writes, and read back what the watcher published.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from typing import Any

import msgspec
import pytest
from kubernetes import dynamic

from contracts import streams, subjects
from contracts.messages import TrainJobObserved, decode_apply, decode_event
from plumbing.bus_history import StoredMessage, read_stream
from tjpipe.local.stack import Stack

from .support import TRAINER, condition_of, create, eventually, get

pytestmark = [pytest.mark.cluster, pytest.mark.nats]

JOBSET = "jobset.x-k8s.io/v1alpha2"


def trainjob(name: str, namespace: str, *, suspend: bool) -> dict[str, Any]:
    return {
        "apiVersion": TRAINER,
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": suspend, "trainer": {"numNodes": 2}},
    }


def _jobs_running(dyn: dynamic.DynamicClient, namespace: str, name: str, active: int) -> None:
    dyn.resources.get(api_version=JOBSET, kind="JobSet").status.patch(
        namespace=namespace,
        name=name,
        body={
            "status": {
                "replicatedJobsStatus": [
                    {"name": "node", "ready": active, "succeeded": 0, "failed": 0, "active": active, "suspended": 0}
                ]
            }
        },
        content_type="application/merge-patch+json",
    )


async def _records(
    stack: Stack, namespace: str, name: str
) -> tuple[list[tuple[StoredMessage, TrainJobObserved]], set[int]]:
    """The TrainJob's observations as the history keeps them, and the events its plans were made from."""
    nc = await stack.connect("reader")
    try:
        js = nc.jetstream()
        stored = await read_stream(js, streams.EVENTS_HISTORY.name, subjects.trainjob_events_filter(namespace, name))
        plans = await read_stream(js, streams.APPLY_HISTORY.name, subjects.trainjob_apply_filter(namespace, name))
    finally:
        await nc.close()
    events = [(s, e) for s in stored if isinstance(e := decode_event(s.data), TrainJobObserved)]
    return events, {decode_apply(p.data).source_seq for p in plans}


def _progress(event: TrainJobObserved) -> Any:
    return msgspec.to_builtins(event.trainjob).get("status", {}).get("trainerStatus")


def _rv(event: TrainJobObserved) -> int:
    return int(event.trainjob.metadata.resource_version)  # type: ignore[union-attr,arg-type]


async def _quiet(stack: Stack, namespace: str, name: str) -> list[tuple[StoredMessage, TrainJobObserved]]:
    """The observations once nothing new has been recorded for two seconds (the deadline only bounds the wait)."""
    seen, since = -1, time.monotonic()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        events, _ = await _records(stack, namespace, name)
        if len(events) != seen:
            seen, since = len(events), time.monotonic()
        elif time.monotonic() - since > 2.0:
            return events
        await asyncio.sleep(0.3)
    raise AssertionError(f"{namespace}/{name}: the history kept growing for 60 s")


async def test_the_pipelines_own_status_write_is_recorded_and_planned_to_nothing(
    pipeline: Stack, dyn: dynamic.DynamicClient, namespace: str
) -> None:
    create(dyn, trainjob("echo", namespace, suspend=False))
    eventually(lambda: get(dyn, JOBSET, "JobSet", namespace, "echo"), what="the JobSet")
    await _quiet(pipeline, namespace, "echo")
    _jobs_running(dyn, namespace, "echo", 2)
    eventually(
        lambda: (get(dyn, TRAINER, "TrainJob", namespace, "echo").get("status") or {}).get("jobsStatus"),
        what="the Jobs' status written",
    )
    events = await _quiet(pipeline, namespace, "echo")
    _, planned_from = await _records(pipeline, namespace, "echo")
    # The JobSet's one change was observed once, planned once, and the write that followed came back as an
    # echo: recorded with the status the pipeline wrote, marked, and no plan made from it.
    last_stored, last = events[-1]
    assert last.echo, [(e.cause, e.echo) for _, e in events]
    assert last.cause == "TrainJob MODIFIED"
    assert last.trainjob.status.jobs_status[0].active == 2  # type: ignore[union-attr,index]
    assert last_stored.origin_seq not in planned_from


async def test_another_writers_change_beside_the_pipelines_write_is_never_taken_for_an_echo(
    pipeline: Stack, dyn: dynamic.DynamicClient, namespace: str
) -> None:
    """Three TrainJobs; for each, at the moment the pipeline writes the Jobs' status, another writer reports
    progress on the status five times and then suspends the job. Every observation that shows another
    writer's change is planned, the last progress reaches the history, and the suspension is acted on."""
    names = [f"race-{i}" for i in range(3)]
    for name in names:
        create(dyn, trainjob(name, namespace, suspend=False))
    for name in names:
        eventually(lambda name=name: get(dyn, JOBSET, "JobSet", namespace, name), what=f"{name}'s JobSet")
    trainjobs = dyn.resources.get(api_version=TRAINER, kind="TrainJob")

    failures: list[BaseException] = []

    def other_writer(name: str) -> None:
        try:
            write(name)
        except BaseException as exc:  # the test fails on it below, not in a thread nobody reads
            failures.append(exc)

    def write(name: str) -> None:
        for percent in range(10, 60, 10):
            progress = {"progressPercentage": percent, "lastUpdatedTime": f"2026-12-05T10:00:{percent:02d}Z"}
            trainjobs.status.patch(
                namespace=namespace,
                name=name,
                body={"status": {"trainerStatus": progress}},
                content_type="application/merge-patch+json",
                field_manager="racer",
            )
            time.sleep(0.02)
        trainjobs.patch(
            namespace=namespace,
            name=name,
            body={"spec": {"suspend": True}},
            content_type="application/merge-patch+json",
            field_manager="racer",
        )

    for name in names:
        writer = threading.Thread(target=other_writer, args=(name,))
        _jobs_running(dyn, namespace, name, 2)
        writer.start()
        writer.join(timeout=30)
    assert not failures, failures
    for name in names:
        eventually(
            lambda name=name: get(dyn, JOBSET, "JobSet", namespace, name)["spec"].get("suspend") is True,
            what=f"{name}'s JobSet suspended",
        )
        eventually(
            lambda name=name: (
                (condition_of(get(dyn, TRAINER, "TrainJob", namespace, name), "Suspended") or {}).get("status")
                == "True"
            ),
            what=f"{name} Suspended",
        )
    marked = 0
    for name in names:
        events = sorted((e for _, e in await _quiet(pipeline, namespace, name)), key=_rv)
        for before, after in itertools.pairwise(events):
            theirs = before.trainjob.spec != after.trainjob.spec or _progress(before) != _progress(after)
            assert not (theirs and after.echo), f"{name}: rv {_rv(after)} shows another writer's change but was marked"
            marked += after.echo
        assert _progress(events[-1]) == {"progressPercentage": 50, "lastUpdatedTime": "2026-12-05T10:00:50Z"}
    assert marked, "no write of the pipeline's own was recognised in any of the three"

"""Issue #13 item 3: Trainer's controller hands its TrainJobs to the pipeline, and back, without churn.

Trainer v2.3.0's own controller (built from its module, shipped settings, its webhooks registered) builds
TrainJobs on mixed runtimes: torch, MPI (hostfile ConfigMap and SSH Secret), a namespaced runtime with no
ML policy and a coscheduling PodGroup, and runtimes with initializer jobs; some are suspended. Then:

1. Trainer restarts over its own objects: what Trainer itself writes on any restart (the baseline).
2. Trainer stops (its webhook configurations removed first, as the README says); the pipeline starts on an
   empty bus and takes over until it is quiet. Then it builds the same 10 TrainJobs under new names.
3. The pipeline stops; Trainer starts again and takes all 20 back until it is quiet.

Writes are counted from the apiserver's own ``apiserver_request_total`` (any status code, dry-runs left
out: the controller's start-up probe is one), as a delta by resource, subresource and verb around each
step, and every object's resourceVersion is compared, which tells a request that changed nothing from one
that did. The setup's own writes (webhook configurations) are left out.

Expected, and asserted:
- no JobSet or PodGroup is written when the pipeline takes over, suspended ones included;
- taking over: one label merge patch per ConfigMap Trainer made (runtime snapshots, MPI hostfiles), a
  create per plan of each SSH Secret, answered 409 and changing nothing, and one status apply for the
  suspended TrainJob without spec.trainer on a torch runtime (the #4076 deviation,
  ``ResourcesCreated``/``ImmutableFieldsKept``); nothing else;
- taking back: only the kinds of write Trainer makes on a restart over its own objects (no Event, so no
  reconcile failed, the pipeline's snapshots included), and the only objects changed are the label on the
  MPI hostfiles the pipeline built and the #4076 env of the suspended JobSet it built without spec.trainer.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from faults.support import (
    JOBSET,
    TRAINER,
    WriteCounts,
    close_pipeline,
    drained,
    events_filter,
    open_pipeline,
    owned_by,
    read_write_counts,
    services_ready,
    subject_count,
    trainjob,
    until,
    until_async,
)
from unit.builders import replicated_job

from contracts import streams
from contracts.labels import MANAGED_BY, MANAGED_BY_LABEL
from tjpipe.local.crds import apply_objects
from tjpipe.local.kubeapi import LocalKube
from tjpipe.local.trainer_controller import TrainerController

pytestmark = [pytest.mark.cluster, pytest.mark.nats]

SHIPPED = ("torch-distributed", "deepspeed-distributed", "torch-distributed-with-cache", "torchtune-llama3.2-1b")
PLAIN_RUNTIME = "plain-coscheduled"
SCHEDULING = "scheduling.x-k8s.io/v1alpha1"
SETUP_RESOURCES = frozenset({"validatingwebhookconfigurations", "mutatingwebhookconfigurations", "leases"})
SETTLE_SECONDS = 3.0
TIMEOUT = 180.0


def _plain_runtime(namespace: str) -> dict[str, Any]:
    """A namespaced TrainingRuntime with no ML policy (Trainer's PlainML path) and a coscheduling PodGroup."""
    container = {
        "name": "node",
        "image": "example.com/plain:1.0",
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
    }
    node = replicated_job("node", [container], ancestor="trainer")
    return {
        "apiVersion": TRAINER,
        "kind": "TrainingRuntime",
        "metadata": {"name": PLAIN_RUNTIME, "namespace": namespace},
        "spec": {
            "podGroupPolicy": {"coscheduling": {"scheduleTimeoutSeconds": 60}},
            "template": {"spec": {"replicatedJobs": [node]}},
        },
    }


def _trainjobs() -> list[dict[str, Any]]:
    jobs = []
    for suspend in (False, True):
        tag = "s" if suspend else "r"
        jobs += [
            trainjob(f"torch-{tag}", runtime="torch-distributed", suspend=suspend),
            trainjob(f"mpi-{tag}", runtime="deepspeed-distributed", suspend=suspend),
            trainjob(
                f"plain-{tag}",
                runtime=PLAIN_RUNTIME,
                runtime_kind="TrainingRuntime",
                suspend=suspend,
                trainer={"numNodes": 2},
            ),
            trainjob(f"cache-{tag}", runtime="torch-distributed-with-cache", suspend=suspend),
            trainjob(
                f"tune-{tag}",
                runtime="torchtune-llama3.2-1b",
                suspend=suspend,
                trainer={},
                extra_spec={
                    "initializer": {
                        "dataset": {"storageUri": "hf://example/dataset"},
                        "model": {"storageUri": "hf://example/model"},
                    }
                },
            ),
        ]
    return jobs


def _built(pipe: Any, names: list[str]) -> bool:
    """Every named TrainJob has a JobSet controlled by it."""
    jobsets, trainjobs = pipe.jobsets(), pipe.trainjobs()
    return all(n in jobsets and owned_by(jobsets[n], trainjobs[n]["metadata"]["uid"]) for n in names)


def _objects(pipe: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Every object of the test's namespace a TrainJob has, by (kind, name)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for api_version, kind in (
        (TRAINER, "TrainJob"),
        (JOBSET, "JobSet"),
        ("v1", "ConfigMap"),
        ("v1", "Secret"),
        (SCHEDULING, "PodGroup"),
    ):
        for obj in pipe.list(api_version, kind):
            if kind in ("ConfigMap", "Secret") and not obj["metadata"].get("ownerReferences"):
                continue  # kube-root-ca.crt and the like
            out[(kind, obj["metadata"]["name"])] = obj
    return out


def _changed(before: dict[tuple[str, str], dict[str, Any]], after: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    keys = set(before) | set(after)
    return sorted(
        f"{kind}/{name}"
        for kind, name in keys
        if (before.get((kind, name)) or {}).get("metadata", {}).get("resourceVersion")
        != (after.get((kind, name)) or {}).get("metadata", {}).get("resourceVersion")
    )


def _writes(delta: WriteCounts) -> dict[str, int]:
    """Write requests by ``resource[/subresource] VERB``, the setup's own left out."""
    out: dict[str, int] = {}
    for (resource, subresource, verb), value in sorted(delta.all_writes().items()):
        if resource in SETUP_RESOURCES or not value:
            continue
        out[f"{resource}{'/' + subresource if subresource else ''} {verb}"] = value
    return out


async def _quiet(kube: LocalKube, idle: Any, *, timeout: float = TIMEOUT) -> WriteCounts:
    """Until ``idle()`` holds and the apiserver saw no write (but the setup's) for SETTLE_SECONDS."""
    deadline = time.monotonic() + timeout
    while True:
        before = _write_counts(kube)
        await asyncio.sleep(SETTLE_SECONDS)
        after = _write_counts(kube)
        if not _writes(after - before) and await idle():
            return after
        if time.monotonic() >= deadline:
            raise AssertionError(f"not quiet after {timeout:.0f}s: {_writes(after - before)}")


async def _trainer_settled(kube: LocalKube, trainer: TrainerController, *, reconciles: int) -> WriteCounts:
    async def idle() -> bool:
        return trainer.trainjob_reconciles() >= reconciles and trainer.trainjob_queue_idle()

    return await _quiet(kube, idle)


def _write_counts(kube: LocalKube) -> WriteCounts:
    """``apiserver_request_total`` write requests by (resource, subresource, verb), dry-runs left out (the
    controller's start-up probe is one)."""
    return read_write_counts(kube, dry_runs=False)


def _labelled(obj: dict[str, Any]) -> bool:
    return (obj["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY


async def test_trainer_to_pipeline_and_back_writes_no_jobset(
    takeover_kube: LocalKube, trainer_controller: TrainerController, tmp_path: Path
) -> None:
    kube, trainer = takeover_kube, trainer_controller
    pipe = open_pipeline(kube, tmp_path / "pipe", runtimes=SHIPPED)
    try:
        ns = pipe.namespace
        apply_objects(pipe.api, [_plain_runtime(ns)], field_manager="tjpipe-test")
        jobs = _trainjobs()
        names = [j["metadata"]["name"] for j in jobs]

        # --- Trainer builds everything.
        trainer.start()
        for job in jobs:
            pipe.create(job)
        await until(lambda: _built(pipe, names), timeout=TIMEOUT, what="Trainer's JobSet of every TrainJob")
        await _trainer_settled(kube, trainer, reconciles=len(names))
        built = _objects(pipe)
        mpi = [n for n in names if n.startswith("mpi-")]
        snapshots = [f"{n}-runtime-snapshot" for n in names]
        hostfiles = [f"{n}-mpi-hostfile" for n in mpi]
        for name in snapshots + hostfiles:
            assert ("ConfigMap", name) in built, f"Trainer made no ConfigMap {name}"
        for name in mpi:
            assert ("Secret", f"{name}-mpi-ssh-auth") in built
        assert {("PodGroup", "plain-r"), ("PodGroup", "plain-s")} <= set(built)

        # --- 1. Trainer restarts over its own objects: the baseline for step 3.
        trainer.stop()
        before = _write_counts(kube)
        trainer.start()
        after = await _trainer_settled(kube, trainer, reconciles=len(names))
        baseline = _writes(after - before)
        baseline_changed = _changed(built, _objects(pipe))
        print(f"[takeover] Trainer restart over its own objects: writes {baseline}, objects changed {baseline_changed}")

        # --- 2. The pipeline takes over.
        trainer.stop()  # webhook configurations first, then the process
        objects = _objects(pipe)
        before = _write_counts(kube)
        pipe.start_all()
        nc = await pipe.connect()
        try:
            js = nc.jetstream()
            await services_ready(js)
            await until_async(
                lambda: _at_least(js, events_filter(ns), len(names)),
                timeout=TIMEOUT,
                what="the watcher's first observation of every TrainJob",
            )

            async def pipeline_idle() -> bool:
                return await drained(js)

            after = await _quiet(kube, pipeline_idle)
            takeover = _writes(after - before)
            taken = _objects(pipe)
            takeover_changed = _changed(objects, taken)
            print(f"[takeover] pipeline takes over from Trainer: writes {takeover}, objects changed {takeover_changed}")

            # The pipeline builds TrainJobs of its own, which Trainer must take back as well.
            for job in jobs:
                pipe.create({**job, "metadata": {**job["metadata"], "name": "p-" + job["metadata"]["name"]}})
            own = ["p-" + n for n in names]
            await until(lambda: _built(pipe, own), timeout=TIMEOUT, what="the pipeline's JobSet of every TrainJob")
            built_own = _writes(await _quiet(kube, pipeline_idle) - after)
            print(f"[takeover] the pipeline builds {len(own)} TrainJobs of its own: writes {built_own}")
        finally:
            await nc.close()
        handed = _objects(pipe)

        # --- 3. Trainer takes back.
        for process in pipe.processes.values():
            process.stop(timeout=5)
        before = _write_counts(kube)
        trainer.start()
        after = await _trainer_settled(kube, trainer, reconciles=len(names) + len(own))
        rollback = _writes(after - before)
        rollback_changed = _changed(handed, _objects(pipe))

        print(f"[takeover] Trainer takes back from the pipeline: writes {rollback}, objects changed {rollback_changed}")
    finally:
        print(close_pipeline(pipe))

    # No JobSet (nor PodGroup) is written in either direction, nor changed.
    assert not [k for k in takeover if k.startswith(("jobsets", "podgroups"))], takeover
    assert not [c for c in takeover_changed if c.startswith(("JobSet/", "PodGroup/"))], takeover_changed
    assert not [c for c in rollback_changed if c.startswith("PodGroup/")], rollback_changed

    # Taking over: the label alone (a merge patch) on each ConfigMap and Secret Trainer made, and the one
    # deliberate deviation: a suspended TrainJob without spec.trainer on a torch runtime gets the framework
    # env Trainer forgets (#4076), which its existing JobSet keeps out, so ResourcesCreated says so.
    # Trainer's SSH Secrets are left unread and unlabelled: the applier may only create Secrets, and its
    # create, answered 409 AlreadyExists, is the whole check (once per plan of the TrainJob).
    labelled = [f"ConfigMap/{n}" for n in snapshots + hostfiles]
    secret_creates = takeover.pop("secrets POST", 0)
    assert secret_creates >= len(mpi), takeover
    assert takeover == {
        "configmaps PATCH": len(snapshots) + len(hostfiles),
        "trainjobs/status APPLY": 1,
    }, takeover
    assert takeover_changed == sorted([*labelled, "TrainJob/tune-s"]), takeover_changed
    assert all(_labelled(taken[tuple(c.split("/", 1))]) for c in labelled)  # type: ignore[index]

    # Taking back: only the kinds of write Trainer makes on any restart over its own objects (its no-op
    # applies of suspended JobSets, PodGroups and MPI hostfiles, as many as it reconciles). What changes is
    # what Trainer itself changes: the label the pipeline's own applies put on the MPI hostfiles it made
    # (Trainer re-applies them without it), and the framework env and port of a suspended JobSet whose
    # TrainJob has no spec.trainer, which Trainer does not inject (#4076) and removes on its next apply.
    assert set(rollback) <= set(baseline), (rollback, baseline)
    assert baseline_changed == [], baseline_changed
    assert rollback_changed == ["ConfigMap/p-mpi-r-mpi-hostfile", "ConfigMap/p-mpi-s-mpi-hostfile", "JobSet/p-tune-s"]


async def _at_least(js: Any, subject: str, count: int) -> bool:
    return await subject_count(js, streams.EVENTS.name, subject) >= count

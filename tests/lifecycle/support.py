"""Reads and waits the lifecycle tests share: pods of a TrainJob, runtime patches, a TrainJob's status trail."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from faults.support import JOBSET, TRAINER, Pipeline, dead_letters, services_ready
from kubernetes import client as kube_client

from tjpipe.local.cluster import FAIL_ANNOTATION, RUN_TIME_ANNOTATION

from .trainer_status import status_shape

Obj = dict[str, Any]

JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
PATCH_MANAGER = "example.com/lifecycle"
LONG_RUN = {RUN_TIME_ANNOTATION: "1h"}
"""Pods that stay Running until something stops them (a suspension, a deadline, a deletion)."""
FAIL = {FAIL_ANNOTATION: "true"}


def pod_patch(pods: dict[str, Obj], *, manager: str = PATCH_MANAGER) -> dict[str, Any]:
    """One ``runtimePatches`` entry: for each replicated job named in ``pods``, a patch of its pod template
    (``{"metadata": {...}, "spec": {...}}``)."""
    replicated = [{"name": rjob, "template": {"spec": {"template": template}}} for rjob, template in pods.items()]
    return {"manager": manager, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": replicated}}}}


def annotated(annotations: dict[str, str], *rjobs: str) -> dict[str, Any]:
    """A runtime patch putting ``annotations`` on the pods of ``rjobs``."""
    return pod_patch({rjob: {"metadata": {"annotations": annotations}} for rjob in rjobs})


def pods_of(p: Pipeline, name: str) -> list[Obj]:
    """The TrainJob's pods (those of its JobSet), oldest first."""
    listed = kube_client.CoreV1Api(p.api).list_namespaced_pod(
        p.namespace, label_selector=f"{JOBSET_NAME_LABEL}={name}", _preload_content=False
    )
    pods: list[Obj] = json.loads(listed.data)["items"]
    return sorted(pods, key=lambda pod: (pod["metadata"]["creationTimestamp"], pod["metadata"]["name"]))


def phases(pods: list[Obj]) -> list[str]:
    return sorted(pod.get("status", {}).get("phase", "") for pod in pods)


def trainjob_status(p: Pipeline, name: str) -> Obj:
    return status_shape(p.get(TRAINER, "TrainJob", name))


def jobset_of(p: Pipeline, name: str) -> Obj | None:
    return p.get_or_none(JOBSET, "JobSet", name)


def jobset_condition(jobset: Obj | None, kind: str) -> Obj | None:
    for cond in ((jobset or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == kind and cond["status"] == "True":
            return dict(cond)
    return None


@dataclass
class StatusTrail:
    """Every distinct status (shape, without transition times) a TrainJob was seen with, in order."""

    name: str
    seen: list[Obj] = field(default_factory=list)

    def record(self, p: Pipeline) -> Obj:
        status = trainjob_status(p, self.name)
        if not self.seen or self.seen[-1] != status:
            self.seen.append(status)
        return status

    async def until(
        self,
        p: Pipeline,
        want: Obj,
        *,
        timeout: float,
        what: str,
        interval: float = 0.2,
        alternatives: list[Obj] | None = None,
    ) -> None:
        """Poll until the status is exactly ``want`` (or one of ``alternatives``); on time-out say what was
        seen, and the services' logs."""
        deadline = time.monotonic() + timeout
        while True:
            if self.record(p) in [want, *(alternatives or [])]:
                return
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"timed out after {timeout:.0f}s waiting for {what}: want {want}\nseen: "
                    + json.dumps(self.seen, indent=1)
                    + f"\n{p.log_tails(15)}"
                )
            await asyncio.sleep(interval)

    def was(self, want: Obj) -> bool:
        return want in self.seen


async def ready(p: Pipeline) -> None:
    """The module's services have bound their consumers."""
    nc = await p.connect()
    try:
        await services_ready(nc.jetstream())
    finally:
        await nc.close()


@dataclass(frozen=True)
class Reconciler:
    """Who reconciles the test's TrainJobs: the pipeline, or (``trainer``) Kubeflow Trainer v2.3.0's own
    controller manager, the reference the same scenario is checked against.

    ``p`` reads and writes in the test's namespace either way; with Trainer, no pipeline service runs.
    """

    p: Pipeline
    trainer: bool

    async def ready(self) -> None:
        if not self.trainer:
            await ready(self.p)

    async def dead_letters(self) -> list[Any]:
        return [] if self.trainer else await dead_letters_of(self.p)


async def dead_letters_of(p: Pipeline) -> list[Any]:
    """The dead letters about TrainJobs in the module's namespace."""
    nc = await p.connect()
    try:
        return list(await dead_letters(nc.jetstream(), p.namespace))
    finally:
        await nc.close()

"""Builders shared by the planner's tests: TrainJob, runtime and replicated-job dicts, the observed event,
a plan with a chosen set of plugins, and pickers for what a plan holds.

Each builder writes the plain dict a test would otherwise spell out, shaped like Trainer v2.3.0's objects;
its keyword arguments name the parts that vary, and a part left out is left out of the dict too. A test
module fixes its own names (TrainJob name, namespace, uid, runtime) in a thin wrapper around these.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import msgspec

from contracts import messages as m
from contracts.jobset import JobSet
from contracts.trainer import TrainingRuntime, TrainJob
from planner.core import plan
from planner.framework import FieldError, Framework
from planner.info import RuntimeInfo
from planner.plugins import REGISTRY
from planner.runtime_info import new_runtime_info

Obj = dict[str, Any]

TRAINER_API = "trainer.kubeflow.org/v1alpha1"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
RANK = {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
"""The ``valueFrom`` of a rank variable: the pod's Job completion index."""
OBSERVED_AT = 1_700_000_000.0
"""The watcher's clock in events built here unless a test says otherwise (2023-11-14T22:13:20Z)."""

ApplyT = TypeVar("ApplyT", bound=m.ApplyMessage)
ObjectApplyT = TypeVar("ObjectApplyT", bound=m.ObjectApply)


# ------------------------------------------------------------------------------------------ plugins


def framework(*names: str) -> Framework:
    """The registry's plugins of these names, in the order given."""
    factories = dict(REGISTRY)
    return Framework([(name, factories[name]) for name in names])


FRAMEWORK_WITHOUT_FLUX_AND_MPI = framework("coscheduling", "volcano", "plainml", "torch", "jobset", "jax", "xgboost")
"""Every registered plugin but Flux and MPI, in the registry's order."""


# ------------------------------------------------------------------------------------------ objects


def trainjob_dict(
    trainer: Obj | None = None,
    *,
    name: str,
    namespace: str,
    uid: str | None = None,
    runtime: str,
    runtime_kind: str | None = None,
    spec: Obj | None = None,
    metadata: Obj | None = None,
    status: Obj | None = None,
) -> Obj:
    """A TrainJob of ``runtime``: ``spec`` adds to (or replaces) ``runtimeRef``, ``trainer`` is ``spec.trainer``,
    ``metadata`` adds to name, namespace and uid."""
    runtime_ref: Obj = {"name": runtime}
    if runtime_kind is not None:
        runtime_ref["kind"] = runtime_kind
    body: Obj = {"runtimeRef": runtime_ref, **(spec or {})}
    if trainer is not None:
        body["trainer"] = trainer
    meta: Obj = {"name": name, "namespace": namespace}
    if uid is not None:
        meta["uid"] = uid
    out: Obj = {
        "apiVersion": TRAINER_API,
        "kind": "TrainJob",
        "metadata": {**meta, **(metadata or {})},
        "spec": body,
    }
    if status is not None:
        out["status"] = status
    return out


def runtime_dict(
    replicated_jobs: list[Obj],
    *,
    name: str,
    kind: str = "ClusterTrainingRuntime",
    ml_policy: Obj | None = None,
    pod_group_policy: Obj | None = None,
    metadata: Obj | None = None,
    template_metadata: Obj | None = None,
    jobset_spec: Obj | None = None,
) -> Obj:
    """A runtime whose JobSet template runs ``replicated_jobs``; ``metadata`` adds to the runtime's name,
    ``template_metadata`` is the JobSet template's metadata, ``jobset_spec`` its other spec fields."""
    template: Obj = {"spec": {**(jobset_spec or {}), "replicatedJobs": replicated_jobs}}
    if template_metadata is not None:
        template["metadata"] = template_metadata
    spec: Obj = {"template": template}
    if ml_policy is not None:
        spec["mlPolicy"] = ml_policy
    if pod_group_policy is not None:
        spec["podGroupPolicy"] = pod_group_policy
    return {
        "apiVersion": TRAINER_API,
        "kind": kind,
        "metadata": {"name": name, **(metadata or {})},
        "spec": spec,
    }


def replicated_job(
    name: str,
    containers: list[Obj],
    *,
    ancestor: str | None = None,
    replicas: int | None = None,
    parallelism: int | None = None,
    depends_on: list[Obj] | None = None,
    init_containers: list[Obj] | None = None,
    pod: Obj | None = None,
) -> Obj:
    """A replicated job whose pods run ``containers``; ``ancestor`` is its trainjob-ancestor-step label,
    ``pod`` the pod spec's other fields."""
    pod_spec: Obj = {**(pod or {}), "containers": containers}
    if init_containers is not None:
        pod_spec["initContainers"] = init_containers
    job_spec: Obj = {"template": {"spec": pod_spec}}
    if parallelism is not None:
        job_spec["parallelism"] = parallelism
    template: Obj = {"spec": job_spec}
    if ancestor is not None:
        template["metadata"] = {"labels": {ANCESTOR: ancestor}}
    out: Obj = {"name": name, "template": template}
    if replicas is not None:
        out["replicas"] = replicas
    if depends_on is not None:
        out["dependsOn"] = depends_on
    return out


def pod_set(
    name: str,
    ancestor: str,
    requests: Obj | None = None,
    priority_class: str | None = None,
    *,
    init_containers: list[Obj] | None = None,
) -> Obj:
    """A replicated job of one container ``example.com/<name>`` asking for ``requests``, as the gang-scheduling
    tests sum them; the container is ``node`` in the trainer's job and named after the job elsewhere."""
    container: Obj = {"name": "node" if ancestor == "trainer" else name, "image": f"example.com/{name}"}
    if requests is not None:
        container["resources"] = {"requests": requests}
    pod: Obj = {}
    if priority_class is not None:
        pod["priorityClassName"] = priority_class
    return replicated_job(name, [container], ancestor=ancestor, init_containers=init_containers, pod=pod)


def runtime_patch(manager: str, *, metadata: Obj | None = None, replicated_jobs: list[Obj] | None = None) -> Obj:
    """A ``spec.runtimePatches`` entry of ``manager``: the JobSet template's ``metadata`` and replicated-job
    patches (see ``job_patch``)."""
    template: Obj = {}
    if metadata is not None:
        template["metadata"] = metadata
    if replicated_jobs is not None:
        template["spec"] = {"replicatedJobs": replicated_jobs}
    return {"manager": manager, "trainingRuntimeSpec": {"template": template}}


def job_patch(
    name: str, *, pod_spec: Obj | None = None, pod_metadata: Obj | None = None, job_metadata: Obj | None = None
) -> Obj:
    """A replicated-job entry of a runtime patch: the job template's metadata, its pods' metadata and spec."""
    pod: Obj = {}
    if pod_metadata is not None:
        pod["metadata"] = pod_metadata
    if pod_spec is not None:
        pod["spec"] = pod_spec
    template: Obj = {"spec": {"template": pod}}
    if job_metadata is not None:
        template["metadata"] = job_metadata
    return {"name": name, "template": template}


def owner_reference(name: str, uid: str) -> Obj:
    """The controller reference to the TrainJob that every planned object carries."""
    return {
        "apiVersion": TRAINER_API,
        "kind": "TrainJob",
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def suspended_condition(suspended: bool, last_transition_time: str) -> Obj:
    """The TrainJob's ``Suspended`` condition as Trainer writes it on suspend (True) and resume (False)."""
    reason, message = ("Suspended", "TrainJob is suspended") if suspended else ("Resumed", "TrainJob is resumed")
    return {
        "type": "Suspended",
        "status": "True" if suspended else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": last_transition_time,
    }


# ------------------------------------------------------------------------------------- event and plan


def trainjob_observed(
    job: Obj,
    rt: Obj | None,
    *,
    runtime_source: m.RuntimeSource = "live",
    runtime_error: str = "",
    priority_classes: tuple[str, ...] | None = None,
    jobset: Obj | None = None,
    observed_at: float = OBSERVED_AT,
    cause: str = "",
    trace_id: str = "",
) -> m.TrainJobObserved:
    """The watcher's event for these dicts; every keyword defaults to the event's own default."""
    return m.TrainJobObserved(
        trainjob=msgspec.convert(job, TrainJob),
        runtime=msgspec.convert(rt, TrainingRuntime) if rt is not None else None,
        runtime_source=runtime_source,
        runtime_error=runtime_error,
        priority_classes=priority_classes,
        jobset=msgspec.convert(jobset, JobSet) if jobset is not None else None,
        observed_at=observed_at,
        cause=cause,
        trace_id=trace_id,
    )


def plan_with(framework: Framework, event: m.Event, *, source_seq: int = 1) -> m.Plan:
    """The plan of ``event`` by these plugins only."""
    return plan(event, source_seq=source_seq, framework=framework)


class Validator(Protocol):
    def validate(self, info: RuntimeInfo, job: TrainJob) -> list[FieldError]: ...


def validate_with(
    validator: Validator, job: Obj, rt: Obj, *, priority_classes: frozenset[str] | None = None
) -> list[FieldError]:
    """What a plugin (or a whole framework) finds wrong with ``job`` on ``rt``, before any plan."""
    tj = msgspec.convert(job, TrainJob)
    info = new_runtime_info(tj, msgspec.convert(rt, TrainingRuntime))
    info.priority_classes = priority_classes
    return validator.validate(info, tj)


# ------------------------------------------------------------------------------------------- pickers


def applies_of(p: m.Plan, kind: type[ApplyT]) -> list[ApplyT]:
    """The plan's messages of one kind, in order."""
    return [a for a in p.applies if isinstance(a, kind)]


def only_object(p: m.Plan, kind: type[ObjectApplyT]) -> Obj:
    """The object of the plan's one message of ``kind``, as builtins."""
    messages = applies_of(p, kind)
    assert len(messages) == 1, p
    out: Obj = msgspec.to_builtins(messages[0].object)
    return out


def jobset_of(p: m.Plan) -> Obj:
    """The JobSet of the plan's one JobSet message, as builtins."""
    return only_object(p, m.ApplyJobSet)


def components(p: m.Plan) -> list[m.ApplyMessage]:
    """The plan's messages but the TrainJob status."""
    return [a for a in p.applies if not isinstance(a, m.ApplyTrainJobStatus)]


def pod_spec(js: Obj, job_name: str) -> Obj:
    """The pod spec of one replicated job of a JobSet as builtins."""
    rj = next(rj for rj in js["spec"]["replicatedJobs"] if rj["name"] == job_name)
    spec: Obj = rj["template"]["spec"]["template"]["spec"]
    return spec

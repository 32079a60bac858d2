"""Building the IR from a runtime and a TrainJob, before any plugin runs (Trainer's ``newRuntimeInfo``).

This is the one place that reads the runtime template: metadata from runtime and patches, the patched
JobSet spec, ``resourcesPerNode`` merged onto the trainer's ``node`` container, and one pod set per
replicated job with its initial count and per-pod requests.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import msgspec

from contracts import trainer as t
from contracts.trainer import Trainer, TrainingRuntime, TrainingRuntimeSpec, TrainJob, TrainJobSpec
from contracts.values import is_set, or_default
from planner.info import Container, PodSet, RuntimeInfo
from planner.merge import merge_resources, parse_quantity
from planner.patches import apply_runtime_patches

Obj = dict[str, Any]


def builtins(value: object) -> Any:
    return msgspec.to_builtins(value)


_EMPTY_SPEC = TrainJobSpec()
_EMPTY_RUNTIME_SPEC = TrainingRuntimeSpec()


def spec_of(job: TrainJob) -> TrainJobSpec:
    return or_default(job.spec, _EMPTY_SPEC)


def trainer_of(job: TrainJob) -> Trainer | None:
    return or_default(spec_of(job).trainer, None)


def new_runtime_info(job: TrainJob, runtime: TrainingRuntime) -> RuntimeInfo:
    rspec = or_default(runtime.spec, _EMPTY_RUNTIME_SPEC)
    template = or_default(rspec.template, None)
    meta = template.metadata if template is not None and is_set(template.metadata) else None
    labels = dict(meta.labels) if meta is not None and is_set(meta.labels) else {}
    annotations = dict(meta.annotations) if meta is not None and is_set(meta.annotations) else {}

    patches: list[Obj] = []
    for patch in or_default(spec_of(job).runtime_patches, []):
        trs = patch.training_runtime_spec
        if not is_set(trs) or not is_set(trs.template):
            continue
        ptemplate = trs.template
        if is_set(ptemplate.metadata):
            if is_set(ptemplate.metadata.labels):
                labels.update(ptemplate.metadata.labels)
            if is_set(ptemplate.metadata.annotations):
                annotations.update(ptemplate.metadata.annotations)
        if is_set(ptemplate.spec):
            patches.append(builtins(ptemplate.spec))

    spec: Obj = builtins(template.spec) if template is not None and is_set(template.spec) else {}
    if patches:
        spec = apply_runtime_patches(spec, patches)

    ml_policy = or_default(rspec.ml_policy, None)
    pod_group_policy = or_default(rspec.pod_group_policy, None)
    trainer_spec = or_default(spec_of(job).trainer, None)
    resources_per_node = (
        builtins(trainer_spec.resources_per_node)
        if trainer_spec is not None and is_set(trainer_spec.resources_per_node)
        else None
    )
    launcher_as_node = ml_policy is not None and is_set(ml_policy.mpi) and ml_policy.mpi.run_launcher_as_node is True

    pod_sets: list[PodSet] = []
    for rjob in spec.get("replicatedJobs") or []:
        job_template = rjob.setdefault("template", {})
        job_spec = job_template.setdefault("spec", {})
        pod_spec = job_spec.setdefault("template", {}).setdefault("spec", {})
        count = int(job_spec.get("parallelism", 1))
        ancestor = ((job_template.get("metadata") or {}).get("labels") or {}).get(t.LABEL_TRAINJOB_ANCESTOR)
        if ancestor == t.ANCESTOR_TRAINER and ml_policy is not None:
            count = ml_policy.num_nodes if is_set(ml_policy.num_nodes) else 1
        trainer_like = (ancestor == t.ANCESTOR_TRAINER and ml_policy is not None) or (
            launcher_as_node and rjob.get("name") == t.NODE
        )
        if resources_per_node is not None and trainer_like:
            for container in pod_spec.get("containers") or []:
                if container.get("name") == t.NODE:
                    container["resources"] = merge_resources(container.get("resources"), resources_per_node)
                    break
        pod_sets.append(
            PodSet(
                name=str(rjob.get("name", "")),
                ancestor=ancestor,
                count=max(count, 1),
                containers=[_container(c) for c in pod_spec.get("containers") or []],
                init_containers=[_container(c) for c in pod_spec.get("initContainers") or []],
                volumes=[dict(v) for v in pod_spec.get("volumes") or []],
                single_pod_requests=pod_requests(pod_spec),
            )
        )

    return RuntimeInfo(
        labels=labels,
        annotations=annotations,
        ml_policy=ml_policy,
        pod_group_policy=pod_group_policy,
        jobset_spec=spec,
        pod_sets=pod_sets,
        trainer_command=list(trainer_spec.command)
        if trainer_spec is not None and is_set(trainer_spec.command)
        else None,
        trainer_args=list(trainer_spec.args) if trainer_spec is not None and is_set(trainer_spec.args) else None,
    )


def _container(c: Obj) -> Container:
    return Container(
        name=str(c.get("name", "")),
        image=str(c.get("image", "")),
        command=list(c["command"]) if c.get("command") else None,
        env=[dict(e) for e in c.get("env") or []],
        ports=[dict(p) for p in c.get("ports") or []],
        volume_mounts=[dict(m) for m in c.get("volumeMounts") or []],
    )


def pod_requests(pod_spec: Obj) -> dict[str, Decimal]:
    """Effective requests of one pod: running containers plus sidecars, or the largest init step.

    Follows Kubernetes' PodRequests: regular containers and restartable (sidecar) init containers run
    together; each ordinary init container runs alone next to the sidecars started before it; the pod
    needs the larger of the two, plus any declared overhead.
    """

    def requests(c: Obj) -> dict[str, Decimal]:
        raw = (c.get("resources") or {}).get("requests") or {}
        return {k: parse_quantity(v) for k, v in raw.items()}

    def add(into: dict[str, Decimal], more: dict[str, Decimal]) -> None:
        for k, v in more.items():
            into[k] = into.get(k, Decimal(0)) + v

    running: dict[str, Decimal] = {}
    for c in pod_spec.get("containers") or []:
        add(running, requests(c))
    init_peak: dict[str, Decimal] = {}
    sidecars: dict[str, Decimal] = {}
    for c in pod_spec.get("initContainers") or []:
        req = requests(c)
        if c.get("restartPolicy") == "Always":
            add(sidecars, req)
            step = dict(sidecars)
        else:
            step = dict(sidecars)
            add(step, req)
        for k, v in step.items():
            init_peak[k] = max(init_peak.get(k, Decimal(0)), v)
    add(running, sidecars)
    total = {k: max(running.get(k, Decimal(0)), init_peak.get(k, Decimal(0))) for k in {*running, *init_peak}}
    overhead = {k: parse_quantity(v) for k, v in (pod_spec.get("overhead") or {}).items()}
    add(total, overhead)
    return total

"""Building the IR from a runtime and a TrainJob, before any plugin runs (Trainer's ``newRuntimeInfo``).

This is the one place that reads the runtime template: metadata from runtime and patches, the patched
JobSet spec, ``resourcesPerNode`` merged onto the trainer's ``node`` container, and one pod set per
replicated job with its initial count and per-pod requests.

Thousands of TrainJobs usually share one runtime, so what depends on the runtime alone is derived once per
runtime version (``RuntimeTemplate``) and kept in a small LRU cache. Its key is the runtime's encoded bytes,
and every value is computed from those bytes, so a runtime that changes under the same name is a new
entry, never a stale answer. Nothing mutable in the cache is handed to a plan: each plan decodes its own
copy of the JobSet spec, so whatever plugins do to the IR stays inside that plan.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from types import MappingProxyType
from typing import Any

import msgspec
from msgspec import UNSET

from contracts import trainer as t
from contracts.trainer import Runtime, Trainer, TrainingRuntime, TrainingRuntimeSpec, TrainJob, TrainJobSpec
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
    # ``or_default`` spelled out: every plugin calls this several times per plan.
    spec = job.spec
    return _EMPTY_SPEC if spec is msgspec.UNSET or spec is None else spec


def trainer_of(job: TrainJob) -> Trainer | None:
    spec = job.spec
    if spec is msgspec.UNSET or spec is None or spec.trainer is msgspec.UNSET:
        return None
    return spec.trainer


def node_resources(info: RuntimeInfo, job: TrainJob) -> Obj | None:
    """resourcesPerNode of the TrainJob if set, else the runtime's trainer ``node`` container resources.

    Every ML policy that counts GPUs or CPUs per node (torch, MPI, XGBoost, Flux) reads it the same way.
    """
    trainer = trainer_of(job)
    if trainer is not None and trainer.resources_per_node is not UNSET:
        resources: Obj = builtins(trainer.resources_per_node)
        return resources
    for rjob in info.jobset_spec.get("replicatedJobs") or []:
        labels = ((rjob.get("template") or {}).get("metadata") or {}).get("labels") or {}
        if rjob.get("name") == t.NODE or labels.get(t.LABEL_TRAINJOB_ANCESTOR) == t.ANCESTOR_TRAINER:
            pod_spec = rjob["template"]["spec"]["template"]["spec"]
            for container in pod_spec.get("containers") or []:
                if container.get("name") == t.NODE and container.get("resources") is not None:
                    found: Obj = container["resources"]
                    return found
    return None


RUNTIME_CACHE_SIZE = 64
"""Runtime versions whose template is kept; a cluster has a handful of runtimes, each edited now and then."""


@dataclass(frozen=True, eq=False)
class RuntimeTemplate:
    """What a plan reads from the runtime alone, derived from its encoded bytes and shared between plans."""

    encoded: bytes
    """The whole runtime as msgspec JSON: the cache key, and what the runtime snapshot is rendered from."""
    spec_json: bytes
    """``spec.template.spec`` as JSON (``{}`` when unset); every plan decodes its own mutable copy."""
    labels: MappingProxyType[str, str]
    annotations: MappingProxyType[str, str]
    container_names: Mapping[str, frozenset[str]]
    """Replicated job name → names of its containers and init containers, as the runtime declares them."""


def runtime_template(runtime: Runtime) -> RuntimeTemplate:
    return _template(msgspec.json.encode(runtime))


@functools.lru_cache(maxsize=RUNTIME_CACHE_SIZE)
def _template(encoded: bytes) -> RuntimeTemplate:
    # Decoded from the key itself, so the template can only ever describe the bytes it is filed under.
    runtime = msgspec.json.decode(encoded, type=TrainingRuntime)
    rspec = or_default(runtime.spec, _EMPTY_RUNTIME_SPEC)
    template = or_default(rspec.template, None)
    meta = template.metadata if template is not None and is_set(template.metadata) else None
    spec: Obj = builtins(template.spec) if template is not None and is_set(template.spec) else {}
    return RuntimeTemplate(
        encoded=encoded,
        spec_json=msgspec.json.encode(spec),
        labels=MappingProxyType(dict(meta.labels) if meta is not None and is_set(meta.labels) else {}),
        annotations=MappingProxyType(dict(meta.annotations) if meta is not None and is_set(meta.annotations) else {}),
        container_names=MappingProxyType({name: frozenset(names) for name, names in container_names(spec).items()}),
    )


def new_runtime_info(job: TrainJob, runtime: Runtime, template: RuntimeTemplate | None = None) -> RuntimeInfo:
    """``template`` is ``runtime_template(runtime)`` when the caller already has it."""
    if template is None:
        template = runtime_template(runtime)
    rspec = runtime.spec if runtime.spec is not UNSET else _EMPTY_RUNTIME_SPEC
    labels = template.labels.copy()
    annotations = template.annotations.copy()
    job_spec_ = spec_of(job)

    patches: list[Obj] = []
    for patch in job_spec_.runtime_patches or ():
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

    spec: Obj = msgspec.json.decode(template.spec_json)
    if patches:
        spec = apply_runtime_patches(spec, patches)

    ml_policy = rspec.ml_policy if rspec.ml_policy is not UNSET else None
    trainer_spec = job_spec_.trainer if job_spec_.trainer is not UNSET else None
    resources_per_node = (
        builtins(trainer_spec.resources_per_node)
        if trainer_spec is not None and trainer_spec.resources_per_node is not UNSET
        else None
    )
    launcher_as_node = (
        ml_policy is not None and ml_policy.mpi is not UNSET and ml_policy.mpi.run_launcher_as_node is True
    )

    pod_sets: list[PodSet] = []
    for rjob in spec.get("replicatedJobs") or ():
        job_template = rjob.setdefault("template", {})
        job_spec = job_template.setdefault("spec", {})
        pod_spec = job_spec.setdefault("template", {}).setdefault("spec", {})
        count = int(job_spec.get("parallelism", 1))
        ancestor = ((job_template.get("metadata") or {}).get("labels") or {}).get(t.LABEL_TRAINJOB_ANCESTOR)
        if ancestor == t.ANCESTOR_TRAINER and ml_policy is not None:
            count = ml_policy.num_nodes if ml_policy.num_nodes is not UNSET else 1
        containers = pod_spec.get("containers") or ()
        if resources_per_node is not None and (
            (ancestor == t.ANCESTOR_TRAINER and ml_policy is not None)
            or (launcher_as_node and rjob.get("name") == t.NODE)
        ):
            for container in containers:
                if container.get("name") == t.NODE:
                    container["resources"] = merge_resources(container.get("resources"), resources_per_node)
                    break
        init_containers = pod_spec.get("initContainers")
        volumes = pod_spec.get("volumes")
        pod_sets.append(
            PodSet(
                name=str(rjob.get("name", "")),
                ancestor=ancestor,
                count=max(count, 1),
                containers=[_container(c) for c in containers],
                init_containers=[_container(c) for c in init_containers] if init_containers else [],
                volumes=[dict(v) for v in volumes] if volumes else [],
                single_pod_requests=pod_requests(pod_spec),
            )
        )

    return RuntimeInfo(
        labels=labels,
        annotations=annotations,
        ml_policy=ml_policy,
        pod_group_policy=rspec.pod_group_policy if rspec.pod_group_policy is not UNSET else None,
        jobset_spec=spec,
        pod_sets=pod_sets,
        trainer_command=list(trainer_spec.command)
        if trainer_spec is not None and trainer_spec.command is not UNSET
        else None,
        trainer_args=list(trainer_spec.args) if trainer_spec is not None and trainer_spec.args is not UNSET else None,
    )


def _container(c: Obj) -> Container:
    command = c.get("command")
    env = c.get("env")
    ports = c.get("ports")
    mounts = c.get("volumeMounts")
    return Container(
        name=str(c.get("name", "")),
        image=str(c.get("image", "")),
        command=list(command) if command else None,
        env=[dict(e) for e in env] if env else [],
        ports=[dict(p) for p in ports] if ports else [],
        volume_mounts=[dict(m) for m in mounts] if mounts else [],
    )


def pod_requests(pod_spec: Obj) -> dict[str, Decimal]:
    """Effective requests of one pod: running containers plus sidecars, or the largest init step.

    Follows Kubernetes' PodRequests: regular containers and restartable (sidecar) init containers run
    together; each ordinary init container runs alone next to the sidecars started before it; the pod
    needs the larger of the two, plus any declared overhead.
    """
    running: dict[str, Decimal] = {}
    for c in pod_spec.get("containers") or ():
        _add_requests(running, c)
    init_containers = pod_spec.get("initContainers")
    if init_containers:
        init_peak: dict[str, Decimal] = {}
        sidecars: dict[str, Decimal] = {}
        for c in init_containers:
            if c.get("restartPolicy") == "Always":
                _add_requests(sidecars, c)
                step = dict(sidecars)
            else:
                step = dict(sidecars)
                _add_requests(step, c)
            for k, v in step.items():
                init_peak[k] = max(init_peak.get(k, _ZERO), v)
        for k, v in sidecars.items():
            running[k] = running.get(k, _ZERO) + v
        total = {k: max(running.get(k, _ZERO), init_peak.get(k, _ZERO)) for k in {*running, *init_peak}}
    elif running and min(running.values()) < _ZERO:
        total = {k: max(v, _ZERO) for k, v in running.items()}
    else:
        total = running
    overhead = pod_spec.get("overhead")
    if overhead:
        for k, v in overhead.items():
            total[k] = total.get(k, _ZERO) + parse_quantity(v)
    return total


_ZERO = Decimal(0)


def _add_requests(into: dict[str, Decimal], container: Obj) -> None:
    resources = container.get("resources")
    requests = resources.get("requests") if resources else None
    if requests:
        for k, v in requests.items():
            into[k] = into.get(k, _ZERO) + parse_quantity(v)


def container_names(jobset_spec: Obj) -> dict[str, set[str]]:
    """Replicated job name → names of its containers and init containers."""
    names: dict[str, set[str]] = {}
    for rjob in jobset_spec.get("replicatedJobs") or ():
        if not isinstance(rjob, dict):
            continue
        pod = _pod_spec_of(rjob) or {}
        found = names.setdefault(str(rjob.get("name", "")), set())
        for key in ("initContainers", "containers"):
            found.update(str(c.get("name", "")) for c in pod.get(key) or ())
    return names


def _pod_spec_of(rjob: Obj) -> Any:
    value: Any = rjob
    for key in ("template", "spec", "template", "spec"):
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value

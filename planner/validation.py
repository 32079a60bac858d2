"""Trainer's admission checks, as pure functions the planner runs on every plan.

Trainer rejects bad runtimes and TrainJobs in validating webhooks, before they are stored. This project has
no webhook, so a bad object is stored and reaches the planner; the planner runs the same checks on every
plan and, when they fail, reports every broken field on the TrainJob instead of building components that
would fail later, further away, with a vaguer error.

Rules and messages follow Trainer v2.3.0 (``pkg/webhooks``, the JobSet plugin's ``Validate``), with the
fix for upstream #3809 (counts below 1) added. Paths are more precise than upstream's where upstream
reports a whole list: ``spec.runtimePatches[1].manager`` rather than ``spec.runtimePatches.manager``.

One implementation, two callers. The planner runs ``trainjob_errors`` on every plan, after the fact; the
admission webhook (``planner.admission``, ``tjpipe webhook``) runs the same function through
``admission_trainjob_errors`` before the object is stored, plus the update-only rule
``runtime_patches_change_errors``: ``runtimePatches`` may change only while suspended, and not while the
JobSet has active jobs. That rule compares the stored object with the update, so only the webhook, which
holds both, can apply it; the planner only ever sees the stored object.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Set
from typing import Any

import msgspec
from msgspec import UNSET

from contracts import trainer as t
from contracts.jobset import JobSet
from contracts.trainer import Runtime, RuntimePatch, TrainJob
from contracts.values import is_set, or_default
from planner.framework import FORBIDDEN, INVALID, FieldError, Framework, Phases
from planner.info import RuntimeInfo
from planner.runtime_info import container_names, new_runtime_info, runtime_template, spec_of

Obj = dict[str, Any]

RUNTIME_REF_PATH = "spec.runtimeRef"
RUNTIME_PATCHES_PATH = "spec.runtimePatches"
REPLICATED_JOBS_PATH = "spec.template.spec.replicatedJobs"
POD_SPEC_SUFFIX = "template.spec.template.spec"
"""From a replicated job (or a replicated-job patch) to its pod spec."""

MSG_REPLICAS = "always must be 1"
MSG_MIN_ONE = "must be greater than or equal to 1"
MSG_PATCH_UNKNOWN_JOB = "must not have replicated job that doesn't exist in the runtime job template"
MSG_PATCH_RESERVED_ENV = (
    f"must not have envs for the {t.DATASET_INITIALIZER}, {t.MODEL_INITIALIZER}, {t.NODE} containers"
)
MSG_PATCHES_NOT_SUSPENDED = (
    "RuntimePatches can only be modified when the TrainJob is suspended before or after the update"
)
MSG_REQUIRED = "Required value"

_ANCESTOR_CONTAINERS = {
    t.ANCESTOR_TRAINER: t.NODE,
    t.ANCESTOR_DATASET_INITIALIZER: t.DATASET_INITIALIZER,
    t.ANCESTOR_MODEL_INITIALIZER: t.MODEL_INITIALIZER,
}
_ENV_RESERVED_CONTAINERS = frozenset({t.DATASET_INITIALIZER, t.MODEL_INITIALIZER, t.NODE})


def msg_missing_ancestor_container(ancestor: str) -> str:
    return f"must contain the required container for the ancestor: {ancestor}"


def msg_patch_unknown_container(kind: str, job_name: str) -> str:
    """``kind`` is ``container`` or ``initContainer``."""
    return f"must not have {kind} that doesn't exist in the runtime job {job_name}"


def msg_patches_job_active(job_name: str) -> str:
    return f"RuntimePatches cannot be modified when the JobSet's ReplicatedJob {job_name} is still active"


# ------------------------------------------------------------------------------------------- runtimes


def validate_runtime(runtime: Runtime) -> list[FieldError]:
    """The TrainingRuntime / ClusterTrainingRuntime validating webhook, plus #3809 for ``mlPolicy.numNodes``.

    Upstream rule: every replicated job whose Job template carries the ancestor label ``trainer``,
    ``dataset-initializer`` or ``model-initializer`` must have ``replicas`` 1 (unset means the CRD default,
    1) and must contain the container for that ancestor: ``node``, ``dataset-initializer`` or
    ``model-initializer``. Fix of #3809: ``spec.mlPolicy.numNodes``, when set, must be at least 1.

    The label ``trainer.kubeflow.org/webhook-validation: disabled`` is not honoured here. Upstream it only
    keeps the webhook away from the object (an objectSelector); it does not make a runtime that breaks
    these rules produce a working JobSet. So we check every runtime; the runtimes Trainer ships, all
    carrying that label, pass.
    """
    errors: list[FieldError] = []
    for idx, rjob in enumerate(_replicated_jobs(_runtime_jobset_spec(runtime))):
        labels = _dig(rjob, "template", "metadata", "labels")
        ancestor = labels.get(t.LABEL_TRAINJOB_ANCESTOR) if isinstance(labels, dict) else None
        if ancestor not in _ANCESTOR_CONTAINERS:
            continue
        path = f"{REPLICATED_JOBS_PATH}[{idx}]"
        replicas = rjob.get("replicas", t.DEFAULT_JOBSET_REPLICAS)
        if replicas != 1:
            errors.append(FieldError(f"{path}.replicas", MSG_REPLICAS, kind=INVALID, value=replicas))
        containers = _dig(rjob, *POD_SPEC_SUFFIX.split("."), "containers") or []
        if _ANCESTOR_CONTAINERS[ancestor] not in {c.get("name") for c in containers}:
            errors.append(
                FieldError(
                    f"{path}.{POD_SPEC_SUFFIX}.containers",
                    msg_missing_ancestor_container(ancestor),
                    kind=INVALID,
                    value=containers,
                )
            )
    rspec = runtime.spec
    if is_set(rspec) and is_set(rspec.ml_policy):
        num_nodes = rspec.ml_policy.num_nodes
        if is_set(num_nodes) and num_nodes < 1:
            errors.append(FieldError("spec.mlPolicy.numNodes", MSG_MIN_ONE, kind=INVALID, value=num_nodes))
    return errors


# ------------------------------------------------------------------------------------------ TrainJobs


def validate_trainjob(job: TrainJob, info: RuntimeInfo, *, runtime: Runtime | None = None) -> list[FieldError]:
    """The JobSet plugin's ``Validate`` (less the update-only rule), plus #3809 for ``spec.trainer``.

    Upstream rules, in upstream's order:

    * ``spec.initializer.dataset`` set → the runtime has a replicated job ``dataset-initializer`` holding a
      container (or init container) ``dataset-initializer``, and that regular container mounts the volume
      ``initializer``; the same for ``spec.initializer.model`` and ``model-initializer``. Checked against
      ``info``, i.e. the template after runtime patches, as upstream does.
    * each ``runtimePatches[].manager`` is a domain-prefixed path (apimachinery's ``IsDomainPrefixedPath``);
    * each patched replicated job exists in the runtime, and each patched container / init container exists
      in that job (containers and init containers count together);
    * no patch sets ``env`` on a container named ``node``, ``dataset-initializer`` or ``model-initializer``.

    Fix of #3809: ``spec.trainer.numNodes`` and ``spec.trainer.numProcPerNode``, when set, are at least 1.

    Pass ``runtime`` to check patch targets against the runtime's own template. Upstream checks them
    against the template *after* the patches were merged in, where a merge has already added every name a
    patch mentions, so through the webhook those two rules never fire (its unit tests pass an unpatched
    template). Without ``runtime`` this function does the same as upstream: it checks against ``info``.
    """
    errors: list[FieldError] = []
    spec = spec_of(job)
    initializer = spec.initializer if spec.initializer is not UNSET else None
    patches = spec.runtime_patches or ()
    # Container names are only needed by the initializer and patch rules: most TrainJobs skip both.
    merged_names: Mapping[str, Set[str]] = (
        container_names(info.jobset_spec) if initializer is not None or (patches and runtime is None) else {}
    )
    ref = msgspec.to_builtins(spec.runtime_ref) if is_set(spec.runtime_ref) else None
    if initializer is not None and is_set(initializer.dataset):
        errors.extend(_initializer_errors(info.jobset_spec, merged_names, t.DATASET_INITIALIZER, "datasetConfig", ref))
    if initializer is not None and is_set(initializer.model):
        errors.extend(_initializer_errors(info.jobset_spec, merged_names, t.MODEL_INITIALIZER, "modelConfig", ref))

    if patches:
        target_names = merged_names if runtime is None else runtime_template(runtime).container_names
        for i, patch in enumerate(patches):
            errors.extend(_patch_errors(f"{RUNTIME_PATCHES_PATH}[{i}]", patch, target_names))

    trainer = spec.trainer
    if trainer is not UNSET:
        if trainer.num_nodes is not UNSET and trainer.num_nodes < 1:
            errors.append(FieldError("spec.trainer.numNodes", MSG_MIN_ONE, kind=INVALID, value=trainer.num_nodes))
        nproc = trainer.num_proc_per_node
        if nproc is not UNSET and nproc < 1:
            errors.append(FieldError("spec.trainer.numProcPerNode", MSG_MIN_ONE, kind=INVALID, value=nproc))
    return errors


def trainjob_errors(job: TrainJob, runtime: Runtime, info: RuntimeInfo, phases: Phases) -> list[FieldError]:
    """Every check Trainer's TrainJob webhook runs on create and update: the rules above, then each
    CustomValidation plugin's. The planner calls it with the ``info`` and ``phases`` it goes on building
    with; the webhook calls it through ``admission_trainjob_errors``."""
    return validate_trainjob(job, info, runtime=runtime) + phases.validate(info, job)


def admission_trainjob_errors(
    job: TrainJob, runtime: Runtime, framework: Framework, *, priority_classes: frozenset[str] | None = None
) -> list[FieldError]:
    """``trainjob_errors`` for a TrainJob not stored yet, against the live ``runtime`` it names.

    Like Trainer's ``ValidateObjects``, the runtime info is built with patches merged but no plugin
    enforcement. A TrainJob whose patches cannot be merged with the runtime is refused at ``spec.runtimePatches``.
    ``priority_classes``: the cluster's PriorityClass names, for the Volcano check (``None``: not checked).
    """
    template = runtime_template(runtime)
    try:
        info = new_runtime_info(job, runtime, template)
    except (ValueError, TypeError) as exc:
        return [FieldError(RUNTIME_PATCHES_PATH, f"cannot be merged with the runtime: {exc}")]
    info.priority_classes = priority_classes
    return trainjob_errors(job, runtime, info, framework.phases(info, template.encoded))


def _initializer_errors(
    jobset_spec: Obj, names: Mapping[str, Set[str]], step: str, config: str, ref: object
) -> list[FieldError]:
    """``ref``: the TrainJob's runtimeRef, the value Trainer reports these errors with."""
    containers = names.get(step)
    if containers is None:
        return [
            FieldError(
                RUNTIME_REF_PATH,
                f"must have {step} job when trainJob is configured with input {config}",
                kind=INVALID,
                value=ref,
            )
        ]
    if step not in containers:
        return [
            FieldError(
                RUNTIME_REF_PATH, f"must have container with name - {step} in the {step} job", kind=INVALID, value=ref
            )
        ]
    for rjob in _replicated_jobs(jobset_spec):
        if rjob.get("name") != step:
            continue
        for container in _dig(rjob, *POD_SPEC_SUFFIX.split("."), "containers") or []:
            if container.get("name") != step:
                continue
            if any(m.get("name") == t.INITIALIZER_VOLUME for m in container.get("volumeMounts") or []):
                return []
    return [
        FieldError(
            RUNTIME_REF_PATH,
            f"must have volumeMount with name - {t.INITIALIZER_VOLUME} in container {step} of the {step} job",
            kind=INVALID,
            value=ref,
        )
    ]


def _patch_errors(path: str, patch: RuntimePatch, names: Mapping[str, Set[str]]) -> list[FieldError]:
    errors = domain_prefixed_path_errors(f"{path}.manager", or_default(patch.manager, ""))
    trs = patch.training_runtime_spec
    if not is_set(trs) or not is_set(trs.template) or not is_set(trs.template.spec):
        return errors
    for j, rjob_patch in enumerate(or_default(trs.template.spec.replicated_jobs, [])):
        rjob_path = f"{path}.trainingRuntimeSpec.template.spec.replicatedJobs[{j}]"
        job_name = or_default(rjob_patch.name, "")
        containers = names.get(job_name)
        if containers is None:
            errors.append(FieldError(f"{rjob_path}.name", MSG_PATCH_UNKNOWN_JOB))
            continue
        tmpl = rjob_patch.template
        if not is_set(tmpl) or not is_set(tmpl.spec) or not is_set(tmpl.spec.template):
            continue
        pod = tmpl.spec.template.spec
        if not is_set(pod):
            continue
        pod_path = f"{rjob_path}.{POD_SPEC_SUFFIX}"
        for k, c in enumerate(or_default(pod.init_containers, [])):
            if or_default(c.name, "") not in containers:
                errors.append(
                    FieldError(
                        f"{pod_path}.initContainers[{k}].name", msg_patch_unknown_container("initContainer", job_name)
                    )
                )
        for k, c in enumerate(or_default(pod.containers, [])):
            name = or_default(c.name, "")
            if name not in containers:
                errors.append(
                    FieldError(f"{pod_path}.containers[{k}].name", msg_patch_unknown_container("container", job_name))
                )
            elif is_set(c.env) and c.env and name in _ENV_RESERVED_CONTAINERS:
                errors.append(FieldError(f"{pod_path}.containers[{k}].env", MSG_PATCH_RESERVED_ENV))
    return errors


# --------------------------------------------------------------------------- domain-prefixed paths

_DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = _DNS1123_LABEL + r"(\." + _DNS1123_LABEL + ")*"
_DNS1123_SUBDOMAIN_MAX = 253
_HTTP_PATH = r"[A-Za-z0-9/\-._~%!$&'()*+,;=:]+"
_DNS1123_SUBDOMAIN_RE = re.compile(_DNS1123_SUBDOMAIN)
_HTTP_PATH_RE = re.compile(_HTTP_PATH)

MSG_NOT_DOMAIN_PREFIXED = 'must be a domain-prefixed path (such as "acme.io/foo")'
MSG_SUBDOMAIN_TOO_LONG = f"must be no more than {_DNS1123_SUBDOMAIN_MAX} characters"
MSG_NOT_SUBDOMAIN = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character "
    f"(e.g. 'example.com', regex used for validation is '{_DNS1123_SUBDOMAIN}')"
)
MSG_INVALID_PATH = f"Invalid path (regex used for validation is '{_HTTP_PATH}')"


def domain_prefixed_path_errors(path: str, value: str) -> list[FieldError]:
    """apimachinery's ``IsDomainPrefixedPath``: ``<RFC 1123 subdomain>/<HTTP path>``, both parts non-empty."""
    if not value:
        return [FieldError(path, MSG_REQUIRED)]
    host, sep, rest = value.partition("/")
    if not sep or not host or not rest:
        return [FieldError(path, MSG_NOT_DOMAIN_PREFIXED)]
    errors: list[FieldError] = []
    if len(host) > _DNS1123_SUBDOMAIN_MAX:
        errors.append(FieldError(path, MSG_SUBDOMAIN_TOO_LONG))
    if _DNS1123_SUBDOMAIN_RE.fullmatch(host) is None:
        errors.append(FieldError(path, MSG_NOT_SUBDOMAIN))
    if _HTTP_PATH_RE.fullmatch(rest) is None:
        errors.append(FieldError(path, MSG_INVALID_PATH))
    return errors


# ------------------------------------------------------------------------------- runtime patch updates


def runtime_patches_change_errors(old: TrainJob, new: TrainJob, jobset: JobSet | None) -> list[FieldError]:
    """The JobSet plugin's update-only rule, for a caller that holds both the old and the new TrainJob.

    Upstream rule: if ``spec.runtimePatches`` changed and the TrainJob is suspended neither before nor after
    the update, that is Forbidden; otherwise, if it changed and the JobSet exists, every replicated job with
    ``active > 0`` in its status is Forbidden. Upstream reads the JobSet from the API server; here the caller
    passes it (``None`` when there is none). A missing and an empty list or map compare equal, as in
    apimachinery's semantic equality.

    The planner cannot call this: it sees only the stored TrainJob, so it cannot tell whether the patches
    changed, and by the time it sees the change it is already stored.
    """
    old_spec, new_spec = spec_of(old), spec_of(new)
    if not runtime_patches_changed(old, new):
        return []
    if old_spec.suspend is not True and new_spec.suspend is not True:
        return [FieldError(RUNTIME_PATCHES_PATH, MSG_PATCHES_NOT_SUSPENDED, kind=FORBIDDEN)]
    if jobset is None or not is_set(jobset.status):
        return []
    return [
        FieldError(RUNTIME_PATCHES_PATH, msg_patches_job_active(or_default(status.name, "")), kind=FORBIDDEN)
        for status in or_default(jobset.status.replicated_jobs_status, [])
        if or_default(status.active, 0) > 0
    ]


def runtime_patches_changed(old: TrainJob, new: TrainJob) -> bool:
    """Whether the update changes ``spec.runtimePatches`` (missing and empty compare equal)."""
    return bool(_normalized(spec_of(old).runtime_patches) != _normalized(spec_of(new).runtime_patches))


def jobset_decides_patch_change(old: TrainJob, new: TrainJob) -> bool:
    """Whether ``runtime_patches_change_errors`` needs the JobSet: the patches changed around a suspension."""
    return runtime_patches_changed(old, new) and (spec_of(old).suspend is True or spec_of(new).suspend is True)


def _normalized(value: object) -> Any:
    return _drop_empty(msgspec.to_builtins(or_default(value, [])))


def _drop_empty(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: v for k, v in ((k, _drop_empty(v)) for k, v in value.items()) if v != [] and v != {}}
    if isinstance(value, list):
        return [_drop_empty(v) for v in value]
    return value


# -------------------------------------------------------------------------------------------- helpers


def _runtime_jobset_spec(runtime: Runtime) -> Obj:
    rspec = runtime.spec
    if not is_set(rspec) or not is_set(rspec.template) or not is_set(rspec.template.spec):
        return {}
    spec: Obj = msgspec.to_builtins(rspec.template.spec)
    return spec


def _replicated_jobs(jobset_spec: Obj) -> list[Obj]:
    return [rj for rj in jobset_spec.get("replicatedJobs") or [] if isinstance(rj, dict)]


def _dig(obj: Obj, *keys: str) -> Any:
    value: Any = obj
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value

"""Trainer's validating webhooks as pure decisions: an AdmissionReview in, an AdmissionReview out.

Why here, in the planner: the webhook must refuse exactly what the planner would later mark
``ValidationFailed``, so it calls the planner's own checks (``planner.validation``: one implementation, two
callers). Services never import each other and these checks need the planner's runtime info and plugins,
so the webhook is a second entry point of the planner package rather than a service of its own below it.
This module decides; ``planner.webhook`` serves it over TLS and does the reads (the referenced runtime, and
the JobSet for the update-only rule), as Trainer's webhook reads them from the API server.

Denials read like Trainer's: the field.ErrorList aggregated into one message (``FieldError.kubernetes_text``:
``path: Invalid value: <value>: message``, several in brackets, comma-separated), which the API server
prefixes with ``admission webhook "<name>" denied the request:``. Where a check does not record the bad
value (the runtimePatches target checks, whose paths are more precise than Trainer's, and some plugin
checks), the text is ``path: message``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from tjpipe.contracts import trainer as t
from tjpipe.contracts.jobset import JobSet
from tjpipe.contracts.resources import CLUSTER_TRAINING_RUNTIME, TRAINING_RUNTIME, Resource
from tjpipe.contracts.trainer import ClusterTrainingRuntime, Runtime, RuntimeRef, TrainJob, decode_runtime
from tjpipe.contracts.values import meta, name_of, or_default
from tjpipe.planner.framework import INVALID, FieldError, Framework
from tjpipe.planner.runtime_info import spec_of
from tjpipe.planner.validation import (
    admission_trainjob_errors,
    jobset_decides_patch_change,
    runtime_patches_change_errors,
    validate_runtime,
)

ADMISSION_API_VERSION = "admission.k8s.io/v1"
PATH_TRAINJOB = "/validate-trainer-kubeflow-org-v1alpha1-trainjob"
PATH_TRAINING_RUNTIME = "/validate-trainer-kubeflow-org-v1alpha1-trainingruntime"
PATH_CLUSTER_TRAINING_RUNTIME = "/validate-trainer-kubeflow-org-v1alpha1-clustertrainingruntime"
"""controller-runtime's generated paths, as Trainer's webhook configuration names them."""

CREATE, UPDATE = "CREATE", "UPDATE"
_NO_RUNTIME_REF = RuntimeRef()


class MalformedReview(ValueError):
    """The body is not an admission.k8s.io/v1 AdmissionReview with a request: answered with HTTP 400."""


class GroupVersionKind(msgspec.Struct, frozen=True, kw_only=True):
    group: str = ""
    version: str = ""
    kind: str = ""


# The parts of an AdmissionReview (admission.k8s.io/v1) the webhook reads and answers with.
class AdmissionRequest(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    uid: str
    kind: GroupVersionKind
    operation: str
    name: str = ""
    namespace: str = ""
    object: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    old_object: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    """Raw JSON, decoded only by the webhook that knows its type; empty (or ``null``) when absent."""

    def new(self) -> bytes | None:
        return _present(self.object)

    def old(self) -> bytes | None:
        return _present(self.old_object)


def _present(raw: msgspec.Raw) -> bytes | None:
    data = bytes(raw)
    return data if data and data != b"null" else None


class _AdmissionReview(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    api_version: str = ""
    kind: str = ""
    request: AdmissionRequest | None = None


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""
    code: int = 200
    warnings: tuple[str, ...] = ()


ALLOWED = Verdict(allowed=True)


@dataclass(frozen=True)
class RuntimeLookup:
    """Which runtime a TrainJob names, for the shell to GET; ``unsupported`` when no registry has it."""

    resource: Resource
    namespace: str | None
    name: str
    unsupported: str = ""


@dataclass(frozen=True)
class Fetched:
    """What the shell read for a TrainJob review: the runtime (or why not), and the JobSet if asked."""

    runtime: bytes | None = None
    runtime_error: str = ""
    """The GET's error text, e.g. ``trainingruntimes.trainer.kubeflow.org "x" not found``."""
    jobset: bytes | None = None
    priority_classes: frozenset[str] | None = None
    """The cluster's PriorityClass names, read only for a runtime with a Volcano pod-group policy."""


def parse_review(body: bytes) -> AdmissionRequest:
    try:
        review = msgspec.json.decode(body, type=_AdmissionReview)
    except msgspec.DecodeError as exc:
        raise MalformedReview(f"not an AdmissionReview: {exc}") from None
    if review.kind != "AdmissionReview" or review.api_version != ADMISSION_API_VERSION or review.request is None:
        raise MalformedReview(f"expected an {ADMISSION_API_VERSION} AdmissionReview with a request")
    return review.request


def response_body(uid: str, verdict: Verdict) -> bytes:
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {
            "code": verdict.code,
            "reason": _REASONS.get(verdict.code, ""),
            "message": verdict.message,
        }
    if verdict.warnings:
        response["warnings"] = list(verdict.warnings)
    return msgspec.json.encode({"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": response})


_REASONS = {400: "BadRequest", 403: "Forbidden"}


def denied(errors: Sequence[FieldError]) -> Verdict:
    """field.ErrorList.ToAggregate(): one error as it is, several in brackets."""
    texts = list(dict.fromkeys(e.kubernetes_text() for e in errors))
    message = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    return Verdict(allowed=False, message=message, code=403)


def _bad_request(message: str) -> Verdict:
    return Verdict(allowed=False, message=message, code=400)


# ------------------------------------------------------------------------------------------ runtimes


def review_runtime(request: AdmissionRequest) -> Verdict:
    """TrainingRuntime (create; an update is admitted unchecked, as Trainer's ``ValidateUpdate`` does) and
    ClusterTrainingRuntime (create and update; a create of one labelled deprecated gets Trainer's warning)."""
    obj = request.new()
    if request.operation not in (CREATE, UPDATE) or obj is None:
        return ALLOWED
    if request.kind.kind == t.TRAINING_RUNTIME_KIND and request.operation == UPDATE:
        return ALLOWED
    try:
        runtime = decode_runtime(obj)
    except msgspec.DecodeError as exc:
        return _bad_request(f"cannot decode {request.kind.kind}: {exc}")
    warnings: tuple[str, ...] = ()
    if isinstance(runtime, ClusterTrainingRuntime) and request.operation == CREATE and _deprecated(runtime):
        warnings = (
            f'ClusterTrainingRuntime "{name_of(runtime)}" is deprecated and will be removed in a future release '
            f"of Kubeflow Trainer. See runtime deprecation policy: {RUNTIME_DEPRECATION_POLICY_URL}",
        )
    errors = validate_runtime(runtime)
    verdict = denied(errors) if errors else ALLOWED
    return dataclasses.replace(verdict, warnings=warnings) if warnings else verdict


RUNTIME_DEPRECATION_POLICY_URL = (
    "https://trainer.kubeflow.org/en/latest/operator-guides/runtime.html#runtime-deprecation-policy"
)


def _deprecated(runtime: Runtime) -> bool:
    return or_default(meta(runtime).labels, {}).get(t.LABEL_SUPPORT) == t.SUPPORT_DEPRECATED


# ----------------------------------------------------------------------------------------- TrainJobs


def decode_trainjobs(request: AdmissionRequest) -> tuple[TrainJob, TrainJob | None]:
    """The new and (on update) old TrainJob; ``msgspec.DecodeError`` if either does not decode."""
    obj, old_obj = request.new(), request.old()
    if obj is None:
        raise msgspec.DecodeError("the request carries no object")
    new = msgspec.json.decode(obj, type=TrainJob)
    old = msgspec.json.decode(old_obj, type=TrainJob) if old_obj is not None else None
    return new, old


def runtime_lookup(job: TrainJob, namespace: str) -> RuntimeLookup:
    """Trainer's runtime registry: kind ``TrainingRuntime`` or ``ClusterTrainingRuntime`` in its group."""
    ref = or_default(spec_of(job).runtime_ref, _NO_RUNTIME_REF)
    kind = or_default(ref.kind, t.CLUSTER_TRAINING_RUNTIME_KIND)
    group = or_default(ref.api_group, t.GROUP)
    name = or_default(ref.name, "")
    if group == t.GROUP and kind == t.TRAINING_RUNTIME_KIND:
        return RuntimeLookup(resource=TRAINING_RUNTIME, namespace=namespace, name=name)
    if group == t.GROUP and kind == t.CLUSTER_TRAINING_RUNTIME_KIND:
        return RuntimeLookup(resource=CLUSTER_TRAINING_RUNTIME, namespace=None, name=name)
    return RuntimeLookup(resource=CLUSTER_TRAINING_RUNTIME, namespace=None, name=name, unsupported=f"{kind}.{group}")


def needs_priority_classes(runtime: bytes) -> bool:
    """Whether the runtime's Volcano policy makes the plugin check PriorityClasses (the shell lists them then)."""
    try:
        decoded = decode_runtime(runtime)
    except msgspec.DecodeError:
        return False
    spec = decoded.spec
    return (
        spec is not msgspec.UNSET
        and spec.pod_group_policy is not msgspec.UNSET
        and spec.pod_group_policy.volcano is not msgspec.UNSET
    )


def needs_jobset(new: TrainJob, old: TrainJob | None) -> bool:
    """Whether the update-only rule must look at the JobSet (the shell GETs it only then)."""
    return old is not None and jobset_decides_patch_change(old, new)


def review_trainjob(request: AdmissionRequest, fetched: Fetched, framework: Framework) -> Verdict:
    """The TrainJob webhook, create and update, given what the shell read."""
    if request.operation not in (CREATE, UPDATE):
        return ALLOWED
    try:
        new, old = decode_trainjobs(request)
    except msgspec.DecodeError as exc:
        return _bad_request(f"cannot decode TrainJob: {exc}")
    lookup = runtime_lookup(new, request.namespace)
    if lookup.unsupported:
        return Verdict(allowed=False, message=f"unsupported runtime: {lookup.unsupported}", code=403)
    if fetched.runtime is None:
        ref = spec_of(new).runtime_ref
        return denied([_runtime_missing(lookup, fetched.runtime_error, msgspec.to_builtins(ref) if ref else None)])
    try:
        runtime = decode_runtime(fetched.runtime)
    except msgspec.DecodeError as exc:
        return _bad_request(f"cannot decode the runtime {lookup.name}: {exc}")
    warnings: tuple[str, ...] = ()
    if isinstance(runtime, ClusterTrainingRuntime) and _deprecated(runtime):
        warnings = (
            f'Referenced ClusterTrainingRuntime "{name_of(runtime)}" is deprecated and will be removed in a '
            f"future release of Kubeflow Trainer. See runtime deprecation policy: {RUNTIME_DEPRECATION_POLICY_URL}",
        )
    errors = admission_trainjob_errors(new, runtime, framework, priority_classes=fetched.priority_classes)
    if old is not None and request.operation == UPDATE:
        jobset = msgspec.json.decode(fetched.jobset, type=JobSet) if fetched.jobset is not None else None
        errors += runtime_patches_change_errors(old, new, jobset)
    verdict = denied(errors) if errors else ALLOWED
    return dataclasses.replace(verdict, warnings=warnings) if warnings else verdict


def _runtime_missing(lookup: RuntimeLookup, error: str, ref: object) -> FieldError:
    """Trainer's wording, including its path spelling ``spec.RuntimeRef`` for ClusterTrainingRuntimes."""
    if lookup.resource is TRAINING_RUNTIME:
        path, what = "spec.runtimeRef", "trainingRuntime"
    else:
        path, what = "spec.RuntimeRef", "clusterTrainingRuntime"
    reason = error or f'{lookup.resource.plural}.{t.GROUP} "{lookup.name}" not found'
    message = f"{reason}: specified {what} must be created before the TrainJob is created"
    return FieldError(path, message, kind=INVALID, value=ref)

"""``plan(event) -> Plan``: the whole planner, as a pure function.

It reads nothing but its argument and writes nothing at all, so the same event always gives the same plan.
That is what makes the planner cheap to test against golden files, safe to run as many replicas as
wanted, and able to answer "what would this planner have done?" by replaying recorded events.

The order of decisions mirrors Trainer's reconcile: a TrainJob managed by another controller is left
alone; a finished one is never rebuilt; otherwise the runtime is shaped by the plugins and built into
components; the status is planned in every case.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from contracts import conditions as t_ext
from contracts import trainer as t
from contracts.jobset import JOBSET_API_VERSION, JOBSET_KIND, JobSet
from contracts.kube import ConfigMap, Secret
from contracts.messages import (
    ApplyConfigMap,
    ApplyJobSet,
    ApplyMessage,
    ApplyPodGroup,
    ApplySecret,
    ApplyTrainJobStatus,
    ApplyVolcanoPodGroup,
    DeleteComponent,
    Event,
    ObjectKey,
    Plan,
    Target,
    TrainJobDeleted,
    TrainJobObserved,
)
from contracts.scheduling import PodGroup, VolcanoPodGroup
from contracts.trainer import RuntimeRef, TrainingRuntime, TrainJob
from contracts.values import is_set, meta, name_of, namespace_of, or_default, resource_version_of, uid_of
from planner import status as status_rules
from planner.framework import BuildError, Framework
from planner.immutability import restrict_to_mutable
from planner.info import Component, Deletion
from planner.plugins import REGISTRY
from planner.runtime_info import new_runtime_info, spec_of
from planner.snapshot import runtime_snapshot
from planner.validation import validate_runtime, validate_trainjob

FRAMEWORK = Framework(REGISTRY)


def plan(event: Event, *, source_seq: int, framework: Framework = FRAMEWORK) -> Plan:
    if isinstance(event, TrainJobDeleted):
        # Owner references let the API server's garbage collector remove the components.
        return Plan(trainjob=event.key, trainjob_uid=event.uid, source_seq=source_seq)
    return _plan_observed(event, source_seq, framework)


def _plan_observed(event: TrainJobObserved, source_seq: int, framework: Framework) -> Plan:
    job = event.trainjob
    key = ObjectKey(namespace=str(namespace_of(job)), name=str(name_of(job)))
    uid = str(uid_of(job))
    managed_by = or_default(spec_of(job).managed_by, t.MANAGED_BY_TRAINJOB_CONTROLLER)
    if managed_by != t.MANAGED_BY_TRAINJOB_CONTROLLER:
        return Plan(
            trainjob=key,
            trainjob_uid=uid,
            source_seq=source_seq,
            warnings=(f"managed by {managed_by}; left alone",),
        )

    decision = _decide(event, framework)
    version = observation_version(event)
    applies: list[ApplyMessage] = [_message(c, job, key, uid, source_seq, event.trace_id) for c in decision.components]
    applies.extend(_deletion(d, job, key, uid, source_seq, event.trace_id) for d in decision.deletions)
    desired = status_rules.desired_status(job, event.jobset, now=event.observed_at, updates=decision.conditions)
    if desired and status_rules.status_changed(job, desired):
        applies.append(_status_message(job, desired, key, uid, source_seq, event.trace_id))
    applies = [msgspec.structs.replace(a, source_version=version, observed_at=event.observed_at) for a in applies]
    return Plan(
        trainjob=key,
        trainjob_uid=uid,
        source_seq=source_seq,
        applies=tuple(applies),
        warnings=tuple(decision.warnings),
    )


def observation_version(event: TrainJobObserved) -> int:
    """The newest resourceVersion the event carries; 0 when one is not a number (then no fence applies)."""
    versions = [resource_version_of(event.trainjob)]
    if event.jobset is not None:
        versions.append(resource_version_of(event.jobset))
    if event.runtime is not None and event.runtime_source == "live":
        versions.append(resource_version_of(event.runtime))
    try:
        return max(int(v) for v in versions if v)
    except ValueError:
        return 0


@dataclass
class _Decision:
    components: list[Component] = field(default_factory=list)
    deletions: list[Deletion] = field(default_factory=list)
    conditions: list[status_rules.ConditionUpdate] = field(default_factory=list)
    """Condition updates, applied after Suspended and the JobSet's conditions."""
    warnings: list[str] = field(default_factory=list)

    def not_built(self, reason: str, message: str) -> _Decision:
        self.conditions.append(status_rules.condition(t_ext.CONDITION_RESOURCES_CREATED, False, reason, message))
        self.warnings.append(message)
        return self

    def failed(self, reason: str, message: str) -> _Decision:
        self.conditions.append(status_rules.condition(t.CONDITION_FAILED, True, reason, message))
        self.warnings.append(message)
        return self


def _decide(event: TrainJobObserved, framework: Framework) -> _Decision:
    """What to build, delete and report, in Trainer's order of precedence."""
    job = event.trainjob
    decision = _Decision()
    unsupported = _unsupported_runtime(job)
    if unsupported:
        # Upstream #4087: Trainer panics here and the condition is never written.
        return decision.failed(t.REASON_RUNTIME_NOT_SUPPORTED, f"unsupported runtime: {unsupported}")
    if status_rules.is_finished(job):
        # Upstream #3737/#3779: a Failed job stays failed; its components are never rebuilt.
        decision.warnings.append("finished; components are not rebuilt")
        return decision
    if status_rules.deadline_exceeded(job, now=event.observed_at):
        decision.deletions.append(
            Deletion(
                api_version=JOBSET_API_VERSION,
                kind=JOBSET_KIND,
                name=name_of(job),
                reason=t.MESSAGE_DEADLINE_EXCEEDED,
            )
        )
        return decision.failed(t.REASON_DEADLINE_EXCEEDED, t.MESSAGE_DEADLINE_EXCEEDED)
    if event.runtime_error:
        return decision.not_built(t_ext.REASON_INVALID_RUNTIME_SNAPSHOT, event.runtime_error)
    if event.runtime is None:
        return decision.not_built(
            t_ext.REASON_RUNTIME_NOT_FOUND,
            f"{_runtime_ref(job)} not found: the runtime must exist before the TrainJob can be built",
        )

    runtime_errors = [] if _webhook_validation_disabled(event.runtime) else validate_runtime(event.runtime)
    if runtime_errors:
        return decision.not_built(
            t_ext.REASON_INVALID_RUNTIME, f"{_runtime_ref(job)} is invalid: " + "; ".join(map(str, runtime_errors))
        )
    try:
        info = new_runtime_info(job, event.runtime)
    except (ValueError, TypeError) as exc:
        return decision.not_built(t_ext.REASON_BUILD_FAILED, f"the runtime cannot be merged with the TrainJob: {exc}")
    info.priority_classes = frozenset(event.priority_classes) if event.priority_classes is not None else None
    errors = validate_trainjob(job, info, runtime=event.runtime) + framework.validate(info, job)
    if errors:
        # No webhook runs in front of this pipeline: an invalid TrainJob fails with the reasons, precisely.
        return decision.failed(t_ext.REASON_VALIDATION_FAILED, "; ".join(str(e) for e in errors))
    try:
        framework.shape(info, job)
        decision.components = framework.build(info, job)
    except BuildError as exc:
        # Upstream #3671: build errors were only events; here they are a condition on the TrainJob.
        return decision.not_built(t_ext.REASON_BUILD_FAILED, str(exc))
    if event.runtime_source == "live":
        decision.components.insert(0, runtime_snapshot(job, event.runtime))
    decision.conditions.append(
        status_rules.condition(
            t_ext.CONDITION_RESOURCES_CREATED,
            True,
            t_ext.REASON_RESOURCES_CREATED,
            t_ext.MESSAGE_RESOURCES_CREATED,
            only_if_present=True,
        )
    )
    if event.jobset is not None:
        if spec_of(job).suspend is True or _suspended(event.jobset):
            _keep_immutable_fields(decision, event.jobset)
        else:
            # Trainer's rule: a running JobSet (and PodGroup) is left as it is. The applier would check the
            # live object and skip; not sending the message at all saves it the read.
            decision.components = [c for c in decision.components if c.policy != "while-suspended"]
    return decision


def _suspended(jobset: JobSet) -> bool:
    spec = jobset.spec
    return is_set(spec) and spec.suspend is True


def _webhook_validation_disabled(runtime: TrainingRuntime) -> bool:
    """Runtimes labelled so were never checked by Trainer's webhook; Trainer builds them as they are."""
    labels = or_default(meta(runtime).labels, {})
    return labels.get(t.LABEL_WEBHOOK_VALIDATION) == t.WEBHOOK_VALIDATION_DISABLED


def _keep_immutable_fields(decision: _Decision, live: JobSet) -> None:
    """Upstream #3008: an existing JobSet only takes the changes JobSet accepts."""
    for index, component in enumerate(decision.components):
        if not isinstance(component.object, JobSet):
            continue
        restricted, dropped = restrict_to_mutable(component.object, live)
        decision.components[index] = replace(component, object=restricted)
        if dropped:
            message = "the JobSet exists; JobSet keeps these fields as created: " + ", ".join(dropped)
            decision.warnings.append(message)
            decision.conditions.append(
                status_rules.condition(
                    t_ext.CONDITION_RESOURCES_CREATED, True, t_ext.REASON_IMMUTABLE_FIELDS_KEPT, message
                )
            )


def _unsupported_runtime(job: TrainJob) -> str:
    """``Kind.group`` of a runtimeRef this planner cannot resolve, or empty when it is supported."""
    ref = or_default(spec_of(job).runtime_ref, RuntimeRef())
    kind = or_default(ref.kind, t.CLUSTER_TRAINING_RUNTIME_KIND)
    group = or_default(ref.api_group, t.GROUP)
    if group == t.GROUP and kind in (t.TRAINING_RUNTIME_KIND, t.CLUSTER_TRAINING_RUNTIME_KIND):
        return ""
    return f"{kind}.{group}"


def _runtime_ref(job: TrainJob) -> str:
    ref = or_default(spec_of(job).runtime_ref, RuntimeRef())
    kind = or_default(ref.kind, t.CLUSTER_TRAINING_RUNTIME_KIND)
    return f"{kind}/{or_default(ref.name, '')}"


def _message(
    component: Component, job: TrainJob, key: ObjectKey, uid: str, source_seq: int, trace_id: str
) -> ApplyMessage:
    obj = component.object
    common: dict[str, Any] = {
        "trainjob": key,
        "trainjob_uid": uid,
        "source_seq": source_seq,
        "policy": component.policy,
        "trainjob_suspended": spec_of(job).suspend is True,
        "trace_id": trace_id,
        "target": Target(
            api_version=obj.api_version, kind=obj.kind, namespace=key.namespace, name=str(obj.metadata.name)
        ),
    }
    if isinstance(obj, JobSet):
        return ApplyJobSet(object=obj, **common)
    if isinstance(obj, ConfigMap):
        return ApplyConfigMap(object=obj, **common)
    if isinstance(obj, Secret):
        return ApplySecret(object=obj, generate=component.generate, **common)
    if isinstance(obj, PodGroup):
        return ApplyPodGroup(object=obj, **common)
    if isinstance(obj, VolcanoPodGroup):
        return ApplyVolcanoPodGroup(object=obj, **common)
    raise TypeError(f"no apply message for {type(obj).__name__}")


def _deletion(
    deletion: Deletion, job: TrainJob, key: ObjectKey, uid: str, source_seq: int, trace_id: str
) -> DeleteComponent:
    return DeleteComponent(
        trainjob=key,
        trainjob_uid=uid,
        source_seq=source_seq,
        trace_id=trace_id,
        trainjob_suspended=spec_of(job).suspend is True,
        target=Target(
            api_version=deletion.api_version, kind=deletion.kind, namespace=key.namespace, name=deletion.name
        ),
        reason=deletion.reason,
    )


def _status_message(
    job: TrainJob, desired: dict[str, Any], key: ObjectKey, uid: str, source_seq: int, trace_id: str
) -> ApplyTrainJobStatus:
    import msgspec

    obj = msgspec.convert(
        {
            "apiVersion": t.API_VERSION,
            "kind": t.TRAINJOB_KIND,
            # Conditional on the TrainJob as it was observed: a status planned from an older observation
            # is refused by the API server (409) instead of overwriting what a newer one wrote.
            "metadata": {"name": key.name, "namespace": key.namespace, "resourceVersion": resource_version_of(job)},
            "status": desired,
        },
        TrainJob,
    )
    return ApplyTrainJobStatus(
        trainjob=key,
        trainjob_uid=uid,
        source_seq=source_seq,
        trace_id=trace_id,
        target=Target(
            api_version=t.API_VERSION,
            kind=t.TRAINJOB_KIND,
            namespace=key.namespace,
            name=key.name,
            subresource="status",
        ),
        object=obj,
    )

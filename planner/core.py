"""``plan(event) -> Plan``: the whole planner, as a pure function.

It reads nothing but its argument and writes nothing at all, so the same event always gives the same plan.
That is what makes the planner cheap to test against golden files, safe to run as many replicas as
wanted, and able to answer "what would this planner have done?" by replaying recorded events.

The order of decisions mirrors Trainer's reconcile: a TrainJob managed by another controller is left
alone; a finished one is never rebuilt; otherwise the runtime is shaped by the plugins and built into
components; the status is planned in every case.
"""

from __future__ import annotations

from typing import Any

from contracts import trainer as t
from contracts.jobset import JobSet
from contracts.kube import ConfigMap, Secret
from contracts.messages import (
    ApplyConfigMap,
    ApplyJobSet,
    ApplyMessage,
    ApplyPodGroup,
    ApplySecret,
    ApplyTrainJobStatus,
    ApplyVolcanoPodGroup,
    Event,
    ObjectKey,
    Plan,
    Target,
    TrainJobDeleted,
    TrainJobObserved,
)
from contracts.scheduling import PodGroup, VolcanoPodGroup
from contracts.trainer import RuntimeRef, TrainJob
from contracts.values import name_of, namespace_of, or_default, uid_of
from planner import status as status_rules
from planner.framework import BuildError, Framework
from planner.info import Component
from planner.plugins import REGISTRY
from planner.runtime_info import new_runtime_info, spec_of

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

    warnings: list[str] = []
    components: list[Component] = []
    if status_rules.is_finished(job):
        warnings.append("finished; components are not rebuilt")
    elif event.runtime is None:
        warnings.append(f"runtime {_runtime_ref(job)} not found")
    else:
        info = new_runtime_info(job, event.runtime)
        errors = framework.validate(info, job)
        if errors:
            warnings.extend(str(e) for e in errors)
        else:
            try:
                framework.shape(info, job)
                components = framework.build(info, job)
            except BuildError as exc:
                warnings.append(f"build failed: {exc}")

    applies: list[ApplyMessage] = [_message(c, job, key, uid, source_seq, event.trace_id) for c in components]
    desired = status_rules.desired_status(job, event.jobset, now=event.observed_at)
    if desired and status_rules.status_changed(job, desired):
        applies.append(_status_message(job, desired, key, uid, source_seq, event.trace_id))
    return Plan(trainjob=key, trainjob_uid=uid, source_seq=source_seq, applies=tuple(applies), warnings=tuple(warnings))


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


def _status_message(
    job: TrainJob, desired: dict[str, Any], key: ObjectKey, uid: str, source_seq: int, trace_id: str
) -> ApplyTrainJobStatus:
    import msgspec

    obj = msgspec.convert(
        {
            "apiVersion": t.API_VERSION,
            "kind": t.TRAINJOB_KIND,
            "metadata": {"name": key.name, "namespace": key.namespace},
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

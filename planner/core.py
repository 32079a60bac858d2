"""``plan(event) -> Plan``: the whole planner, as a pure function.

It reads nothing but its argument and writes nothing at all, so the same event always gives the same plan.
That is what makes the planner cheap to test against golden files, safe to run as many replicas as
wanted, and able to answer "what would this planner have done?" by replaying recorded events.

The order of decisions mirrors Trainer's reconcile: a TrainJob managed by another controller is left
alone; a finished one is never rebuilt; otherwise the runtime is shaped by the plugins and built into
components; the status is planned in every case.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import msgspec

from contracts import conditions
from contracts import trainer as t
from contracts.jobset import JOBSET_API_VERSION, JOBSET_KIND, JobSet
from contracts.kube import ConfigMap, Secret
from contracts.labels import MANAGED_BY, MANAGED_BY_LABEL
from contracts.messages import (
    MESSAGE_FOR_OBJECT_TYPE,
    UNVERSIONED,
    ApplyMessage,
    ApplySecret,
    ApplyTrainJobStatus,
    DeleteComponent,
    Event,
    ObjectKey,
    Plan,
    Target,
    TrainJobDeleted,
    TrainJobObserved,
)
from contracts.trainer import RuntimeRef, TrainingRuntime, TrainJob
from contracts.values import is_set, meta, name_of, namespace_of, or_default, resource_version_of, uid_of
from planner import status as status_rules
from planner.framework import BuildError, FieldError, Framework
from planner.immutability import carries_immutable_spec, restrict_to_mutable
from planner.info import Component, Deletion
from planner.plugins import REGISTRY
from planner.runtime_info import RUNTIME_CACHE_SIZE, new_runtime_info, runtime_template, spec_of
from planner.snapshot import runtime_snapshot, snapshot_name
from planner.validation import trainjob_errors, validate_runtime

FRAMEWORK = Framework(REGISTRY)


def plan(event: Event, *, source_seq: int, framework: Framework = FRAMEWORK) -> Plan:
    if isinstance(event, TrainJobDeleted):
        # Owner references let the API server's garbage collector remove the components.
        return Plan(trainjob=event.key, trainjob_uid=event.uid, source_seq=source_seq)
    return _plan_observed(event, source_seq, framework)


def _plan_observed(event: TrainJobObserved, source_seq: int, framework: Framework) -> Plan:
    job = event.trainjob
    job_spec = spec_of(job)
    key = ObjectKey(namespace=namespace_of(job), name=name_of(job))
    uid = uid_of(job)
    managed_by = or_default(job_spec.managed_by, t.MANAGED_BY_TRAINJOB_CONTROLLER)
    if managed_by != t.MANAGED_BY_TRAINJOB_CONTROLLER:
        return Plan(
            trainjob=key,
            trainjob_uid=uid,
            source_seq=source_seq,
            warnings=(f"managed by {managed_by}; left alone",),
        )
    if event.echo:
        return _plan_echo(event, source_seq)

    decision = _decide(event, framework)
    common = _Common.of(event, source_seq)
    absent = _seen_absent(event)
    recheck = secret_recheck(job) if any(isinstance(c.object, Secret) for c in decision.components) else ""
    applies: list[ApplyMessage] = [_message(c, common, absent, recheck) for c in decision.components]
    if decision.deletions:
        applies.extend(_deletion(d, common) for d in decision.deletions)
    desired = status_rules.desired_status(job, event.jobset, now=event.observed_at, updates=decision.conditions)
    if desired and status_rules.status_changed(job, desired):
        applies.append(_status_message(job, desired, common))
    return Plan(
        trainjob=key,
        trainjob_uid=uid,
        source_seq=source_seq,
        applies=tuple(applies),
        warnings=tuple(decision.warnings),
    )


def _plan_echo(event: TrainJobObserved, source_seq: int) -> Plan:
    """Only our own status write changed the TrainJob and nothing the decision reads has changed since the
    plan that made it (``watcher.core.EchoGuard``): the components stand as planned, so only the status is
    planned again, from the JobSet this observation carries. It differs only when a newer JobSet status was
    planned from the older TrainJob version and that status write was refused as stale."""
    return _status_only(event, source_seq)


def _status_only(
    event: TrainJobObserved,
    source_seq: int,
    *,
    updates: list[status_rules.ConditionUpdate] | None = None,
    warnings: tuple[str, ...] = (),
) -> Plan:
    """A plan of the TrainJob's status alone, with ``updates`` to its conditions: one message if it changes."""
    job = event.trainjob
    common = _Common.of(event, source_seq)
    desired = status_rules.desired_status(job, event.jobset, now=event.observed_at, updates=updates)
    changed = bool(desired) and status_rules.status_changed(job, desired)
    return Plan(
        trainjob=common.trainjob,
        trainjob_uid=common.trainjob_uid,
        source_seq=source_seq,
        applies=(_status_message(job, desired, common),) if changed else (),
        warnings=warnings,
    )


def plan_too_large(event: TrainJobObserved, *, source_seq: int, sizes: dict[str, int], max_payload: int) -> Plan:
    """What replaces a plan whose messages do not fit the bus: only the TrainJob's status, if it changes.

    ``sizes`` is the encoded size of each component whose message is over ``max_payload``, measured by the
    service (this function stays pure: the measurement is an input) on the component's object alone, so
    the same TrainJob always gets the same condition message. No later delivery of the same event can fit, so
    the service dead-letters the event; the condition ``ResourcesCreated=False``, reason
    ``PlanTooLarge``, tells the TrainJob's owner why nothing was built. It turns True once a plan fits.
    """
    listed = ", ".join(f"{component} is {size} bytes" for component, size in sorted(sizes.items()))
    text = f"{listed}; the bus carries at most {max_payload} bytes per message"
    update = status_rules.condition(
        conditions.CONDITION_RESOURCES_CREATED, False, conditions.REASON_PLAN_TOO_LARGE, text
    )
    return _status_only(event, source_seq, updates=[update], warnings=(text,))


def _seen_absent(event: TrainJobObserved) -> frozenset[tuple[str, str]]:
    """Components (kind, name) the observation shows do not exist: no JobSet, no runtime snapshot.

    The watcher caches both kinds, so their absence from an observation is a fact about that moment; the
    applier may then create them without reading them first (see ``ApplyJobSet.observed_absent``).
    """
    name = name_of(event.trainjob)
    absent = []
    if event.jobset is None:
        absent.append((JOBSET_KIND, name))
    if event.runtime_source == "live":
        absent.append(("ConfigMap", snapshot_name(name)))
    return frozenset(absent)


def observation_version(event: TrainJobObserved) -> int:
    """The newest resourceVersion the event carries; 0 when one is not a number (then no fence applies)."""
    versions = [resource_version_of(event.trainjob)]
    if event.jobset is not None:
        versions.append(resource_version_of(event.jobset))
    if event.runtime is not None and event.runtime_source == "live":
        versions.append(resource_version_of(event.runtime))
    newest: int | None = None
    try:
        for version in versions:
            if version:
                number = int(version)
                if newest is None or number > newest:
                    newest = number
    except ValueError:
        return 0
    return 0 if newest is None else newest


class _Decision(msgspec.Struct):
    components: list[Component] = msgspec.field(default_factory=list)
    deletions: list[Deletion] = msgspec.field(default_factory=list)
    conditions: list[status_rules.ConditionUpdate] = msgspec.field(default_factory=list)
    """Condition updates, applied after Suspended and the JobSet's conditions."""
    warnings: list[str] = msgspec.field(default_factory=list)

    def not_built(self, reason: str, message: str) -> _Decision:
        self.conditions.append(status_rules.condition(conditions.CONDITION_RESOURCES_CREATED, False, reason, message))
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
        return decision.not_built(conditions.REASON_INVALID_RUNTIME_SNAPSHOT, event.runtime_error)
    if event.runtime is None:
        return decision.not_built(
            conditions.REASON_RUNTIME_NOT_FOUND,
            f"{_runtime_ref(job)} not found: the runtime must exist before the TrainJob can be built",
        )

    template = runtime_template(event.runtime)
    runtime_errors = _runtime_errors(template.encoded)
    if runtime_errors:
        return decision.not_built(
            conditions.REASON_INVALID_RUNTIME, f"{_runtime_ref(job)} is invalid: " + "; ".join(map(str, runtime_errors))
        )
    try:
        info = new_runtime_info(job, event.runtime, template)
    except (ValueError, TypeError) as exc:
        return decision.not_built(
            conditions.REASON_BUILD_FAILED, f"the runtime cannot be merged with the TrainJob: {exc}"
        )
    info.priority_classes = frozenset(event.priority_classes) if event.priority_classes is not None else None
    phases = framework.phases(info, template.encoded)
    errors = trainjob_errors(job, event.runtime, info, phases)
    if errors:
        # Created while the webhook was down (or without one): it fails with the reasons, precisely.
        return decision.failed(conditions.REASON_VALIDATION_FAILED, "; ".join(str(e) for e in errors))
    try:
        phases.shape(info, job)
        decision.components = phases.build(info, job)
    except BuildError as exc:
        # Upstream #3671: build errors were only events; here they are a condition on the TrainJob.
        return decision.not_built(conditions.REASON_BUILD_FAILED, str(exc))
    if event.runtime_source == "live":
        decision.components.insert(0, runtime_snapshot(job, event.runtime, encoded=template.encoded))
    decision.conditions.append(_RESOURCES_CREATED)
    if event.jobset is not None:
        if event.wire_version == UNVERSIONED and not carries_immutable_spec(event.jobset):
            # An older watcher's event, from before events carried the JobSet's spec as created: it does not
            # say which fields JobSet keeps as created, so the JobSet is left as it is (a running one would be
            # anyway) until an event that says.
            decision.components = [c for c in decision.components if not isinstance(c.object, JobSet)]
            decision.warnings.append(_IMMUTABLE_FIELDS_UNKNOWN)
            if not (spec_of(job).suspend is True or _suspended(event.jobset)):
                decision.components = [c for c in decision.components if c.policy != "while-suspended"]
        elif spec_of(job).suspend is True or _suspended(event.jobset):
            _keep_immutable_fields(decision, event.jobset)
        else:
            # Still reported while it runs: the JobSet keeps lacking what JobSet refused.
            _keep_immutable_fields(decision, event.jobset, report_only=True)
            # Trainer's rule: a running JobSet (and PodGroup) is left as it is. The applier would check the
            # live object and skip; not sending the message at all saves it the read.
            decision.components = [c for c in decision.components if c.policy != "while-suspended"]
    return decision


@functools.lru_cache(maxsize=RUNTIME_CACHE_SIZE)
def _runtime_errors(encoded: bytes) -> tuple[FieldError, ...]:
    """The runtime's validation errors, once per runtime version (keyed by ``RuntimeTemplate.encoded``)."""
    runtime = msgspec.json.decode(encoded, type=TrainingRuntime)
    return () if _webhook_validation_disabled(runtime) else tuple(validate_runtime(runtime))


_RESOURCES_CREATED = status_rules.condition(
    conditions.CONDITION_RESOURCES_CREATED,
    True,
    conditions.REASON_RESOURCES_CREATED,
    conditions.MESSAGE_RESOURCES_CREATED,
    only_if_present=True,
)
"""Clears an earlier build problem once the components are built; frozen, so one instance serves every plan."""


_IMMUTABLE_FIELDS_UNKNOWN = (
    "the event, unversioned (an older release's watcher), carries none of the JobSet's immutable spec fields; "
    "the JobSet is not re-applied from it"
)


def _suspended(jobset: JobSet) -> bool:
    spec = jobset.spec
    return is_set(spec) and spec.suspend is True


def _webhook_validation_disabled(runtime: TrainingRuntime) -> bool:
    """Runtimes labelled so were never checked by Trainer's webhook; Trainer builds them as they are."""
    labels = or_default(meta(runtime).labels, {})
    return labels.get(t.LABEL_WEBHOOK_VALIDATION) == t.WEBHOOK_VALIDATION_DISABLED


def _keep_immutable_fields(decision: _Decision, live: JobSet, *, report_only: bool = False) -> None:
    """Upstream #3008: an existing JobSet only takes the changes JobSet accepts.

    ``report_only``: the JobSet is not re-applied (it runs, Trainer's rule), but a condition the TrainJob
    already has keeps naming what the JobSet lacks instead of turning healthy; a TrainJob
    without the condition gets none, so its status stays Trainer's.
    """
    for index, component in enumerate(decision.components):
        if not isinstance(component.object, JobSet):
            continue
        restricted, dropped = restrict_to_mutable(component.object, live)
        if not report_only:
            decision.components[index] = msgspec.structs.replace(component, object=restricted)
        if dropped:
            message = "the JobSet exists; JobSet keeps these fields as created: " + ", ".join(dropped)
            decision.warnings.append(message)
            decision.conditions.append(
                status_rules.condition(
                    conditions.CONDITION_RESOURCES_CREATED,
                    True,
                    conditions.REASON_IMMUTABLE_FIELDS_KEPT,
                    message,
                    only_if_present=report_only,
                )
            )


def _unsupported_runtime(job: TrainJob) -> str:
    """``Kind.group`` of a runtimeRef this planner cannot resolve, or empty when it is supported."""
    ref = or_default(spec_of(job).runtime_ref, _NO_RUNTIME_REF)
    if ref.kind is msgspec.UNSET and ref.api_group is msgspec.UNSET:
        return ""  # the defaults, ClusterTrainingRuntime.trainer.kubeflow.org
    kind = or_default(ref.kind, t.CLUSTER_TRAINING_RUNTIME_KIND)
    group = or_default(ref.api_group, t.GROUP)
    if group == t.GROUP and kind in (t.TRAINING_RUNTIME_KIND, t.CLUSTER_TRAINING_RUNTIME_KIND):
        return ""
    return f"{kind}.{group}"


_NO_RUNTIME_REF = RuntimeRef()


def _runtime_ref(job: TrainJob) -> str:
    ref = or_default(spec_of(job).runtime_ref, _NO_RUNTIME_REF)
    kind = or_default(ref.kind, t.CLUSTER_TRAINING_RUNTIME_KIND)
    return f"{kind}/{or_default(ref.name, '')}"


class _Common(msgspec.Struct, frozen=True):
    """The fields every apply message of one plan shares (``envelope``), and whether the TrainJob is
    suspended, which the component messages carry and a status does not.

    Unpacking ``envelope`` costs about half a microsecond more per message than spelling the fields out,
    against a few hundred microseconds per plan: one list of them is worth that.
    """

    trainjob: ObjectKey
    trainjob_uid: str
    source_seq: int
    source_version: int
    trace_id: str
    observed_at: float
    trainjob_suspended: bool

    @property
    def envelope(self) -> dict[str, Any]:
        return {
            "trainjob": self.trainjob,
            "trainjob_uid": self.trainjob_uid,
            "source_seq": self.source_seq,
            "source_version": self.source_version,
            "trace_id": self.trace_id,
            "observed_at": self.observed_at,
        }

    @classmethod
    def of(cls, event: TrainJobObserved, source_seq: int) -> _Common:
        job = event.trainjob
        return cls(
            trainjob=ObjectKey(namespace=namespace_of(job), name=name_of(job)),
            trainjob_uid=uid_of(job),
            source_seq=source_seq,
            source_version=observation_version(event),
            trace_id=event.trace_id,
            observed_at=event.observed_at,
            trainjob_suspended=spec_of(job).suspend is True,
        )


_COMPONENT_MESSAGES = {
    object_type: message_type
    for object_type, message_type in MESSAGE_FOR_OBJECT_TYPE.items()
    if message_type is not ApplyTrainJobStatus
}
"""The apply message for each component object type, derived from the ``ObjectApply`` union.

The TrainJob's status is not a component: ``_status_message`` builds it from the planned status.
"""


def _message(
    component: Component, common: _Common, absent: frozenset[tuple[str, str]], recheck: str = ""
) -> ApplyMessage:
    """``absent``: the (kind, name) of components the observation shows do not exist (``_seen_absent``);
    ``recheck``: a Secret's ``secret_recheck``."""
    obj = component.object
    if isinstance(obj, ConfigMap | Secret):
        obj = _labelled(obj)
    target = Target(
        api_version=obj.api_version, kind=obj.kind, namespace=common.trainjob.namespace, name=str(obj.metadata.name)
    )
    message_type = _COMPONENT_MESSAGES.get(type(obj))
    if message_type is None:
        raise TypeError(f"no apply message for {type(obj).__name__}")
    message = message_type(
        object=obj,
        target=target,
        policy=component.policy,
        **common.envelope,
        trainjob_suspended=common.trainjob_suspended,
        observed_absent=(target.kind, target.name) in absent,
    )
    if isinstance(message, ApplySecret):
        return msgspec.structs.replace(message, generate=component.generate, recheck=recheck)
    return message


def secret_recheck(job: TrainJob) -> str:
    """What sends a Secret's create again although the applier made it already (``ApplySecret.recheck``).

    Nothing may read or watch a Secret, so its deletion cannot be seen; it is made again when someone next
    changes the TrainJob: its spec (``metadata.generation``: a resume, which makes the pods that mount it,
    is one), its labels or its annotations. Status writes, the JobSet's progress, a restart of the pipeline
    and a resync change none of them, so their plans of an existing Secret cost no request.
    """
    metadata = meta(job)
    touched = msgspec.json.encode(
        [or_default(metadata.labels, {}), or_default(metadata.annotations, {})], order="sorted"
    )
    return f"{or_default(metadata.generation, 0)}/{hashlib.sha256(touched).hexdigest()[:16]}"


def _labelled(obj: ConfigMap | Secret) -> ConfigMap | Secret:
    """The object with this pipeline's label, which the watcher selects ConfigMaps and Secrets by.

    The one place it is added (see ``contracts.labels``): the golden tests compare with Trainer modulo it.
    """
    metadata = meta(obj)
    labels = dict(or_default(metadata.labels, {}))
    labels[MANAGED_BY_LABEL] = MANAGED_BY
    return msgspec.structs.replace(obj, metadata=msgspec.structs.replace(metadata, labels=labels))


def _deletion(deletion: Deletion, common: _Common) -> DeleteComponent:
    return DeleteComponent(
        **common.envelope,
        trainjob_suspended=common.trainjob_suspended,
        target=Target(
            api_version=deletion.api_version,
            kind=deletion.kind,
            namespace=common.trainjob.namespace,
            name=deletion.name,
        ),
        reason=deletion.reason,
    )


def _status_message(job: TrainJob, desired: dict[str, Any], common: _Common) -> ApplyTrainJobStatus:
    key = common.trainjob
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
        **common.envelope,
        target=Target(
            api_version=t.API_VERSION,
            kind=t.TRAINJOB_KIND,
            namespace=key.namespace,
            name=key.name,
            subresource="status",
        ),
        object=obj,
        transitions=status_rules.lifecycle_changes(job, desired),
        paced=status_rules.only_counts_changed(job, desired),
    )

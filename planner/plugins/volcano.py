"""Volcano: gang scheduling with Volcano's ``scheduling.volcano.sh/v1beta1`` PodGroup.

Every pod of the TrainJob gets the annotation ``scheduling.k8s.io/group-name: <tj>``, and one PodGroup
named after the TrainJob carries:

* ``minMember`` and ``minResources``, summed exactly as for coscheduling (all pod sets, requests times count);
* ``queue``, when the JobSet annotations (runtime template metadata, overlaid by runtime patches) carry
  ``scheduling.volcano.sh/queue-name``;
* ``priorityClassName``, the value of the **last** replicated job whose pod template sets one;
* ``networkTopology`` from ``podGroupPolicy.volcano.networkTopology``. Trainer v2.3.0 dereferences
  ``highestTierAllowed`` without a nil check; here an unset ``highestTierAllowed`` (or ``mode``) is simply
  left out. The runtime CRD defaults both, so a runtime read from the cluster always has them.

Validation: a queue annotation that is present must not be empty; each pod template's
``priorityClassName`` must name an existing PriorityClass. The cluster's PriorityClass names come with the
event (``RuntimeInfo.priority_classes``); when the watcher does not know them (``None``) the check is
skipped. Like Trainer (upstream #3918), the check stops at the first replicated job that uses
``system-cluster-critical`` or ``system-node-critical`` — later jobs are then not checked at all — and the
errors found before it are kept.

Creation follows the same ``while-suspended`` rule as the coscheduling PodGroup.
"""

from __future__ import annotations

from contracts.scheduling import (
    POD_GROUP_KIND,
    VOLCANO_API_VERSION,
    VOLCANO_GROUP_NAME_ANNOTATION,
    VOLCANO_QUEUE_NAME_ANNOTATION,
    VolcanoPodGroup,
)
from contracts.trainer import TrainJob
from contracts.values import is_set, name_of
from planner.framework import (
    ComponentBuilder,
    CustomValidation,
    EnforcePodGroupPolicy,
    FieldError,
    RuntimeGated,
)
from planner.gofmt import go_quote
from planner.info import Component, RuntimeInfo
from planner.merge import Obj
from planner.owners import owned_metadata
from planner.pod_groups import pod_group_component, pod_group_totals

SYSTEM_PRIORITY_CLASSES = frozenset({"system-cluster-critical", "system-node-critical"})
"""The two built-in priority classes Kubernetes always has; Trainer stops checking when it meets one."""

_MISSING = object()


def _pod_priority_classes(info: RuntimeInfo) -> list[object]:
    """Each replicated job's pod-template ``priorityClassName``, or ``_MISSING`` where it has none."""
    names: list[object] = []
    for rjob in info.jobset_spec.get("replicatedJobs") or []:
        template: Obj = ((rjob.get("template") or {}).get("spec") or {}).get("template") or {}
        pod_spec: Obj = template.get("spec") or {}
        value = pod_spec.get("priorityClassName")
        names.append(_MISSING if value is None else str(value))
    return names


def _enabled(info: RuntimeInfo) -> bool:
    policy = info.pod_group_policy
    return policy is not None and is_set(policy.volcano)


class Volcano:
    name = "volcano"

    def enabled(self, info: RuntimeInfo) -> bool:
        return _enabled(info)

    def validate(self, info: RuntimeInfo, job: TrainJob) -> list[FieldError]:
        if not _enabled(info):
            return []
        errors: list[FieldError] = []
        if info.annotations.get(VOLCANO_QUEUE_NAME_ANNOTATION) == "":
            errors.append(
                FieldError(f"spec.annotations[{VOLCANO_QUEUE_NAME_ANNOTATION}]", "Volcano queue name must not be empty")
            )
        if info.priority_classes is None:
            return errors
        for name in _pod_priority_classes(info):
            if not isinstance(name, str):
                continue
            if name in SYSTEM_PRIORITY_CLASSES:
                return errors
            if name not in info.priority_classes:
                errors.append(
                    FieldError(
                        "spec.templateSpec.priorityClassName",
                        f"PriorityClass {go_quote(name)} doesn't exist: "
                        f"priorityclasses.scheduling.k8s.io {go_quote(name)} not found",
                    )
                )
        return errors

    def enforce_pod_group_policy(self, info: RuntimeInfo, job: TrainJob) -> None:
        if not _enabled(info):
            return
        info.pod_annotations[VOLCANO_GROUP_NAME_ANNOTATION] = name_of(job)

    def sync_parallel_count(self, info: RuntimeInfo) -> None:
        return None

    def build(self, info: RuntimeInfo, job: TrainJob) -> list[Component]:
        policy = info.pod_group_policy
        if policy is None or not is_set(policy.volcano):
            return []
        members, resources = pod_group_totals(info)
        spec: Obj = {"minMember": members, "minResources": resources}
        if VOLCANO_QUEUE_NAME_ANNOTATION in info.annotations:
            spec["queue"] = info.annotations[VOLCANO_QUEUE_NAME_ANNOTATION]
        for name in _pod_priority_classes(info):
            if isinstance(name, str):
                spec["priorityClassName"] = name
        topology = policy.volcano.network_topology
        if is_set(topology):
            rendered: Obj = {}
            if is_set(topology.mode):
                rendered["mode"] = topology.mode
            if is_set(topology.highest_tier_allowed):
                rendered["highestTierAllowed"] = topology.highest_tier_allowed
            spec["networkTopology"] = rendered
        body = {
            "apiVersion": VOLCANO_API_VERSION,
            "kind": POD_GROUP_KIND,
            "metadata": owned_metadata(job, name_of(job)),
            "spec": spec,
        }
        return [pod_group_component(body, VolcanoPodGroup, "Volcano")]


# The extension points Volcano implements, checked by mypy as the Go compiler checks Trainer's
# ``var _ framework.<Point>Plugin = (*Volcano)(nil)``; tests/unit/test_planner_plugin_phases.py ties them to the phases.
_implements_validation: CustomValidation = Volcano()
_implements_pod_group_policy: EnforcePodGroupPolicy = Volcano()
_implements_builder: ComponentBuilder = Volcano()
_implements_gate: RuntimeGated = Volcano()

"""CoScheduling: gang scheduling with the scheduler-plugins ``scheduling.x-k8s.io/v1alpha1`` PodGroup.

Every pod of the TrainJob gets the label ``scheduling.x-k8s.io/pod-group: <tj>``, and one PodGroup named
after the TrainJob asks the scheduler to start all of them or none:

* ``minMember`` is the sum of the pod counts of **all** pod sets (initializers and launchers included);
* ``minResources`` is the sum over pod sets of one pod's effective requests times its count;
* ``scheduleTimeoutSeconds`` comes from the runtime's ``podGroupPolicy.coscheduling`` (the CRD defaults it
  to 60; a runtime that reaches the planner without it gets 60 too, where Trainer would dereference nil).

Trainer builds the PodGroup when it is absent and rewrites it only while the TrainJob is suspended; the
planner cannot read the cluster, so the component carries the ``while-suspended`` policy and the applier
makes that decision against the live object.

The sums are shared with the Volcano plugin, which sizes its PodGroup the same way: ``planner.pod_groups``.
"""

from __future__ import annotations

from contracts.scheduling import (
    COSCHEDULING_API_VERSION,
    COSCHEDULING_POD_GROUP_LABEL,
    POD_GROUP_KIND,
    PodGroup,
)
from contracts.trainer import TrainJob
from contracts.values import is_set, name_of, or_default
from planner.framework import ComponentBuilder, EnforcePodGroupPolicy, RuntimeGated
from planner.info import Component, RuntimeInfo
from planner.owners import owned_metadata
from planner.pod_groups import pod_group_component, pod_group_totals

DEFAULT_SCHEDULE_TIMEOUT_SECONDS = 60
"""The runtime CRD's default for ``podGroupPolicy.coscheduling.scheduleTimeoutSeconds``."""


# ---------------------------------------------------------------------------------------------- plugin


# Laid out as every plugin is: name, enabled, then one method per extension point, each first checking
# its policy.
class CoScheduling:
    name = "coscheduling"

    def enabled(self, info: RuntimeInfo) -> bool:
        policy = info.pod_group_policy
        return policy is not None and is_set(policy.coscheduling)

    def enforce_pod_group_policy(self, info: RuntimeInfo, job: TrainJob) -> None:
        policy = info.pod_group_policy
        if policy is None or not is_set(policy.coscheduling):
            return
        info.pod_labels[COSCHEDULING_POD_GROUP_LABEL] = name_of(job)

    def sync_parallel_count(self, info: RuntimeInfo) -> None:
        return None

    def build(self, info: RuntimeInfo, job: TrainJob) -> list[Component]:
        policy = info.pod_group_policy
        if policy is None or not is_set(policy.coscheduling):
            return []
        members, resources = pod_group_totals(info)
        body = {
            "apiVersion": COSCHEDULING_API_VERSION,
            "kind": POD_GROUP_KIND,
            "metadata": owned_metadata(job, name_of(job)),
            "spec": {
                "minMember": members,
                "minResources": resources,
                "scheduleTimeoutSeconds": or_default(
                    policy.coscheduling.schedule_timeout_seconds, DEFAULT_SCHEDULE_TIMEOUT_SECONDS
                ),
            },
        }
        return [pod_group_component(body, PodGroup, "coscheduling")]


# The extension points CoScheduling implements, checked by mypy as the Go compiler checks Trainer's
# ``var _ framework.<Point>Plugin = (*CoScheduling)(nil)``;
# tests/unit/test_planner_plugin_phases.py ties them to the phases.
_implements_pod_group_policy: EnforcePodGroupPolicy = CoScheduling()
_implements_builder: ComponentBuilder = CoScheduling()
_implements_gate: RuntimeGated = CoScheduling()

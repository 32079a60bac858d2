"""Gang-scheduling PodGroups as msgspec Structs.

Two unrelated kinds share the name ``PodGroup``:

* ``scheduling.x-k8s.io/v1alpha1`` from the Kubernetes scheduler-plugins coscheduling plugin
  (scheduler-plugins v0.35.4-devel): ``PodGroup`` / ``PodGroupSpec`` / ``PodGroupStatus``;
* ``scheduling.volcano.sh/v1beta1`` from Volcano (``volcano.sh/apis`` at the revision Trainer v2.3.0
  pins): ``VolcanoPodGroup`` / ``VolcanoPodGroupSpec`` / ``VolcanoPodGroupStatus``, plus the
  ``NetworkTopologySpec`` that Trainer's runtime API embeds.

Written by hand from the Go types; every field is optional and defaults to ``msgspec.UNSET``.
"""

from __future__ import annotations

import msgspec

from contracts.kube import KubeStruct, ObjectMeta, Quantity

POD_GROUP_KIND = "PodGroup"

# ------------------------------------------------------------------------------ scheduler-plugins

COSCHEDULING_GROUP = "scheduling.x-k8s.io"
COSCHEDULING_VERSION = "v1alpha1"
COSCHEDULING_API_VERSION = f"{COSCHEDULING_GROUP}/{COSCHEDULING_VERSION}"
COSCHEDULING_POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
"""Pod label naming the coscheduling PodGroup a pod belongs to."""

# status.phase
POD_GROUP_PENDING = "Pending"
POD_GROUP_RUNNING = "Running"
POD_GROUP_SCHEDULING = "Scheduling"
POD_GROUP_UNKNOWN = "Unknown"
POD_GROUP_FINISHED = "Finished"
POD_GROUP_FAILED = "Failed"


# Declarations only, mirroring the upstream Go types field by field.
class PodGroupSpec(KubeStruct, frozen=True, kw_only=True):
    min_member: int | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="minMember")
    min_resources: dict[str, Quantity] | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="minResources")
    schedule_timeout_seconds: int | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="scheduleTimeoutSeconds"
    )


class PodGroupStatus(KubeStruct, frozen=True, kw_only=True):
    phase: str | msgspec.UnsetType = msgspec.UNSET
    occupied_by: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="occupiedBy")
    running: int | msgspec.UnsetType = msgspec.UNSET
    succeeded: int | msgspec.UnsetType = msgspec.UNSET
    failed: int | msgspec.UnsetType = msgspec.UNSET
    schedule_start_time: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="scheduleStartTime")


class PodGroup(KubeStruct, frozen=True, kw_only=True):
    """Coscheduling ``scheduling.x-k8s.io/v1alpha1`` PodGroup."""

    api_version: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="apiVersion")
    kind: str | msgspec.UnsetType = msgspec.UNSET
    metadata: ObjectMeta | msgspec.UnsetType = msgspec.UNSET
    spec: PodGroupSpec | msgspec.UnsetType = msgspec.UNSET
    status: PodGroupStatus | msgspec.UnsetType = msgspec.UNSET


# ----------------------------------------------------------------------------------------- Volcano

VOLCANO_GROUP = "scheduling.volcano.sh"
VOLCANO_VERSION = "v1beta1"
VOLCANO_API_VERSION = f"{VOLCANO_GROUP}/{VOLCANO_VERSION}"
VOLCANO_GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"
"""Pod annotation naming the Volcano PodGroup a pod belongs to."""
VOLCANO_QUEUE_NAME_ANNOTATION = "scheduling.volcano.sh/queue-name"
"""Annotation naming the Volcano queue."""

# spec.networkTopology.mode
NETWORK_TOPOLOGY_HARD = "hard"
NETWORK_TOPOLOGY_SOFT = "soft"

# status.phase
VOLCANO_POD_GROUP_PENDING = "Pending"
VOLCANO_POD_GROUP_RUNNING = "Running"
VOLCANO_POD_GROUP_UNKNOWN = "Unknown"
VOLCANO_POD_GROUP_INQUEUE = "Inqueue"
VOLCANO_POD_GROUP_COMPLETED = "Completed"


class NetworkTopologySpec(KubeStruct, frozen=True, kw_only=True):
    mode: str | msgspec.UnsetType = msgspec.UNSET
    """``hard`` or ``soft``."""
    highest_tier_allowed: int | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="highestTierAllowed")


class VolcanoPodGroupSpec(KubeStruct, frozen=True, kw_only=True):
    min_member: int | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="minMember")
    min_task_member: dict[str, int] | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="minTaskMember")
    queue: str | msgspec.UnsetType = msgspec.UNSET
    priority_class_name: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="priorityClassName")
    min_resources: dict[str, Quantity] | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="minResources")
    network_topology: NetworkTopologySpec | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="networkTopology"
    )


class VolcanoPodGroupCondition(KubeStruct, frozen=True, kw_only=True):
    type: str | msgspec.UnsetType = msgspec.UNSET
    status: str | msgspec.UnsetType = msgspec.UNSET
    transition_id: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="transitionID")
    last_transition_time: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="lastTransitionTime")
    reason: str | msgspec.UnsetType = msgspec.UNSET
    message: str | msgspec.UnsetType = msgspec.UNSET


class VolcanoPodGroupStatus(KubeStruct, frozen=True, kw_only=True):
    phase: str | msgspec.UnsetType = msgspec.UNSET
    conditions: list[VolcanoPodGroupCondition] | msgspec.UnsetType = msgspec.UNSET
    running: int | msgspec.UnsetType = msgspec.UNSET
    succeeded: int | msgspec.UnsetType = msgspec.UNSET
    failed: int | msgspec.UnsetType = msgspec.UNSET


class VolcanoPodGroup(KubeStruct, frozen=True, kw_only=True):
    """Volcano ``scheduling.volcano.sh/v1beta1`` PodGroup."""

    api_version: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="apiVersion")
    kind: str | msgspec.UnsetType = msgspec.UNSET
    metadata: ObjectMeta | msgspec.UnsetType = msgspec.UNSET
    spec: VolcanoPodGroupSpec | msgspec.UnsetType = msgspec.UNSET
    status: VolcanoPodGroupStatus | msgspec.UnsetType = msgspec.UNSET

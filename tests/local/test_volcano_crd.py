"""The PodGroups our plugins build, server-side applied against the real CRD schemas.

The coscheduling PodGroup CRD comes from scheduler-plugins at the version Trainer v2.3.0 pins. The
Volcano PodGroup CRD is installed only when ``tjpipe.local.crds.CRD_SOURCES`` names a Volcano release that
provides it; when it does not, the Volcano checks skip with that reason instead of passing vacuously.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import msgspec
import pytest
from kubernetes import client as kube_client
from unit.builders import (
    FRAMEWORK_WITHOUT_FLUX_AND_MPI,
    Obj,
    applies_of,
    plan_with,
    pod_set,
    runtime_dict,
    trainjob_dict,
    trainjob_observed,
)

from contracts import messages as m
from tjpipe.local.crds import CRD_SOURCES, apply_objects, crd_manifests

if TYPE_CHECKING:
    from conftest import KubeCluster

VOLCANO_CRD = "podgroups.scheduling.volcano.sh"
FIELD_MANAGER = "trainer"
PRIORITY_CLASS = "system-cluster-critical"


def _volcano_crd_listed() -> bool:
    """Whether a CRD source can provide the Volcano PodGroup; read from the list, not by downloading."""
    return any(
        source.module.startswith("volcano.sh/") and (not source.only_names or VOLCANO_CRD in source.only_names)
        for source in CRD_SOURCES
    )


requires_volcano_crd = pytest.mark.skipif(
    not _volcano_crd_listed(),
    reason=f"no Volcano release in tjpipe.local.crds.CRD_SOURCES provides {VOLCANO_CRD}",
)


def _plan(namespace: str, pod_group_policy: Obj) -> m.Plan:
    trainer_requests = {"cpu": "2", "memory": "1.5Gi", "nvidia.com/gpu": 1, "example.com/widgets": "1e3"}
    runtime = runtime_dict(
        [
            pod_set("dataset-initializer", "dataset-initializer", {"cpu": "500m", "memory": "1G"}, PRIORITY_CLASS),
            pod_set("node", "trainer", trainer_requests, PRIORITY_CLASS),
        ],
        name="torch-distributed",
        ml_policy={"numNodes": 1, "torch": {}},
        pod_group_policy=pod_group_policy,
        template_metadata={"annotations": {"scheduling.volcano.sh/queue-name": "default"}},
    )
    trainjob = trainjob_dict(
        {"numNodes": 3},
        name="gang",
        namespace=namespace,
        uid="3f1c2b7a-0000-4000-8000-000000000001",
        runtime="torch-distributed",
    )
    event = trainjob_observed(trainjob, runtime, priority_classes=())
    return plan_with(FRAMEWORK_WITHOUT_FLUX_AND_MPI, event)


def _wire(obj: msgspec.Struct) -> Obj:
    out: Obj = json.loads(msgspec.json.encode(obj))
    return out


def _stored(api_client: kube_client.ApiClient, group: str, version: str, namespace: str, name: str) -> Obj:
    custom = kube_client.CustomObjectsApi(api_client)
    stored = custom.get_namespaced_custom_object(group, version, namespace, "podgroups", name)
    assert isinstance(stored, dict)
    return stored


@pytest.mark.cluster
def test_coscheduling_pod_group_is_accepted_by_the_scheduler_plugins_schema(kube: KubeCluster, namespace: str) -> None:
    (message,) = applies_of(_plan(namespace, {"coscheduling": {"scheduleTimeoutSeconds": 90}}), m.ApplyPodGroup)
    sent = _wire(message.object)
    assert sent["spec"] == {
        "minMember": 4,
        "minResources": {
            "cpu": "6500m",
            "example.com/widgets": "3e3",
            "memory": "5831838208",
            "nvidia.com/gpu": "3",
        },
        "scheduleTimeoutSeconds": 90,
    }
    with kube.api_client() as api_client:
        apply_objects(api_client, [sent], field_manager=message.field_manager, force=message.force)
        stored = _stored(api_client, "scheduling.x-k8s.io", "v1alpha1", namespace, "gang")
    assert stored["spec"] == sent["spec"]
    assert stored["metadata"]["ownerReferences"] == sent["metadata"]["ownerReferences"]


@pytest.mark.cluster
@requires_volcano_crd
def test_volcano_pod_group_crd_is_established(kube: KubeCluster) -> None:
    assert VOLCANO_CRD in {manifest["metadata"]["name"] for manifest in crd_manifests()}
    with kube.api_client() as api_client:
        status = kube_client.ApiextensionsV1Api(api_client).read_custom_resource_definition(VOLCANO_CRD).status
    assert status is not None and status.conditions
    assert {c.type: c.status for c in status.conditions}.get("Established") == "True"


@pytest.mark.cluster
@requires_volcano_crd
def test_volcano_pod_group_is_accepted_by_the_volcano_schema(kube: KubeCluster, namespace: str) -> None:
    policy = {"volcano": {"networkTopology": {"mode": "hard", "highestTierAllowed": 1}}}
    (message,) = applies_of(_plan(namespace, policy), m.ApplyVolcanoPodGroup)
    sent = _wire(message.object)
    assert sent["spec"] == {
        "minMember": 4,
        "queue": "default",
        "priorityClassName": "system-cluster-critical",
        "minResources": {
            "cpu": "6500m",
            "example.com/widgets": "3e3",
            "memory": "5831838208",
            "nvidia.com/gpu": "3",
        },
        "networkTopology": {"mode": "hard", "highestTierAllowed": 1},
    }
    with kube.api_client() as api_client:
        apply_objects(api_client, [sent], field_manager=message.field_manager, force=message.force)
        stored = _stored(api_client, "scheduling.volcano.sh", "v1beta1", namespace, "gang")
    assert {k: stored["spec"][k] for k in sent["spec"]} == sent["spec"]

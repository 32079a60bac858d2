"""The PodGroups our plugins build, server-side applied against the real CRD schemas.

The coscheduling PodGroup CRD comes from scheduler-plugins at the version Trainer v2.3.0 pins. The
Volcano PodGroup CRD is installed only when ``tjpipe.local.crds.CRD_SOURCES`` names a Volcano release that
provides it; when it does not, the Volcano checks skip with that reason instead of passing vacuously.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import msgspec
import pytest
from kubernetes import client as kube_client

from contracts import messages as m
from contracts.trainer import TrainingRuntime, TrainJob
from planner.core import plan
from planner.framework import Framework
from planner.plugins.coscheduling import CoScheduling
from planner.plugins.jax import JAX
from planner.plugins.jobset import JobSetPlugin
from planner.plugins.plainml import PlainML
from planner.plugins.torch import Torch
from planner.plugins.volcano import Volcano
from planner.plugins.xgboost import XGBoost
from tjpipe.local.crds import CRD_SOURCES, apply_objects, crd_manifests

if TYPE_CHECKING:
    from conftest import KubeCluster

Obj = dict[str, Any]

VOLCANO_CRD = "podgroups.scheduling.volcano.sh"
FIELD_MANAGER = "trainer"
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
FRAMEWORK = Framework(
    [
        ("coscheduling", CoScheduling),
        ("volcano", Volcano),
        ("plainml", PlainML),
        ("torch", Torch),
        ("jobset", JobSetPlugin),
        ("jax", JAX),
        ("xgboost", XGBoost),
    ]
)


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


def _rjob(name: str, ancestor: str, requests: Obj) -> Obj:
    container = {"name": "node" if ancestor == "trainer" else name, "image": f"example.com/{name}"}
    return {
        "name": name,
        "template": {
            "metadata": {"labels": {ANCESTOR: ancestor}},
            "spec": {
                "template": {
                    "spec": {
                        "priorityClassName": "system-cluster-critical",
                        "containers": [{**container, "resources": {"requests": requests}}],
                    }
                }
            },
        },
    }


def _plan(namespace: str, pod_group_policy: Obj) -> m.Plan:
    runtime = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "torch-distributed"},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "podGroupPolicy": pod_group_policy,
            "template": {
                "metadata": {"annotations": {"scheduling.volcano.sh/queue-name": "default"}},
                "spec": {
                    "replicatedJobs": [
                        _rjob("dataset-initializer", "dataset-initializer", {"cpu": "500m", "memory": "1G"}),
                        _rjob(
                            "node",
                            "trainer",
                            {"cpu": "2", "memory": "1.5Gi", "nvidia.com/gpu": 1, "example.com/widgets": "1e3"},
                        ),
                    ]
                },
            },
        },
    }
    trainjob = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "gang", "namespace": namespace, "uid": "3f1c2b7a-0000-4000-8000-000000000001"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 3}},
    }
    event = m.TrainJobObserved(
        trainjob=msgspec.convert(trainjob, TrainJob),
        runtime=msgspec.convert(runtime, TrainingRuntime),
        observed_at=1_700_000_000.0,
        priority_classes=(),
    )
    return plan(event, source_seq=1, framework=FRAMEWORK)


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
    (message,) = [
        a
        for a in _plan(namespace, {"coscheduling": {"scheduleTimeoutSeconds": 90}}).applies
        if isinstance(a, m.ApplyPodGroup)
    ]
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
    (message,) = [a for a in _plan(namespace, policy).applies if isinstance(a, m.ApplyVolcanoPodGroup)]
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

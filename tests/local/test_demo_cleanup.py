"""A demo TrainJob of an earlier run is removed, with what it owns, before the demo creates its own.

``tjpipe up --demo --detach`` leaves its TrainJobs in etcd (the state folder outlives the processes); the next
``bash scripts/up.sh`` must show a fresh lifecycle, not "created" and "Complete" at once. Against real servers:
the control plane alone (no garbage collector: the owned objects are deleted by name) and the simulated cluster
(kube-controller-manager's garbage collector: a foreground deletion waits until the JobSet's pods are gone).
"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes import client as kube_client
from kubernetes.client.exceptions import ApiException

from tjpipe.local.stack import remove_trainjob

if TYPE_CHECKING:
    from conftest import KubeCluster

    from tjpipe.local.cluster import SimulatedCluster

pytestmark = [pytest.mark.cluster]

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"


def _trainjob(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
    }


def _owned_jobset(namespace: str, name: str, owner: dict[str, Any]) -> dict[str, Any]:
    """A one-pod JobSet controlled by ``owner``, as the pipeline applies one (a pod that ends at once)."""
    ref = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    pod = {"restartPolicy": "Never", "containers": [{"name": "node", "image": "busybox", "command": ["true"]}]}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": namespace, "ownerReferences": [ref]},
        "spec": {
            "replicatedJobs": [
                {"name": "node", "replicas": 1, "template": {"spec": {"template": {"metadata": {}, "spec": pod}}}}
            ]
        },
    }


def _make(api: kube_client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    custom = kube_client.CustomObjectsApi(api)
    trainjob: Any = custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainjobs", _trainjob(namespace, name)
    )
    ref = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "name": name,
        "uid": trainjob["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    custom.create_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", _owned_jobset(namespace, name, trainjob)
    )
    kube_client.CoreV1Api(api).create_namespaced_config_map(
        namespace, {"metadata": {"name": f"{name}-tls-config", "ownerReferences": [ref]}, "data": {"ca.crt": "x"}}
    )
    return dict(trainjob)


def _exists(api: kube_client.ApiClient, namespace: str, name: str) -> dict[str, bool]:
    custom, core = kube_client.CustomObjectsApi(api), kube_client.CoreV1Api(api)
    probes = {
        "TrainJob": lambda: custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name),
        "JobSet": lambda: custom.get_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", name
        ),
        "ConfigMap": lambda: core.read_namespaced_config_map(f"{name}-tls-config", namespace),
    }
    found = {}
    for kind, probe in probes.items():
        try:
            probe()
            found[kind] = True
        except ApiException as error:
            assert error.status == 404, error
            found[kind] = False
    return found


def test_without_a_garbage_collector_the_owned_objects_are_deleted_by_name(kube: KubeCluster, namespace: str) -> None:
    with kube.api_client() as api:
        _make(api, namespace, "mnist")
        unrelated = _make(api, namespace, "other")
        assert remove_trainjob(api, namespace, "mnist", garbage_collector=False, timeout=60) is True
        assert _exists(api, namespace, "mnist") == {"TrainJob": False, "JobSet": False, "ConfigMap": False}
        assert _exists(api, namespace, "other") == {"TrainJob": True, "JobSet": True, "ConfigMap": True}
        assert remove_trainjob(api, namespace, "mnist", garbage_collector=False, timeout=60) is False
        # A TrainJob of the same name made again is a new object: the demo's fresh one.
        again = _make(api, namespace, "mnist")
        assert again["metadata"]["uid"] != unrelated["metadata"]["uid"]
        assert _exists(api, namespace, "mnist") == {"TrainJob": True, "JobSet": True, "ConfigMap": True}


def test_with_the_garbage_collector_the_trainjob_goes_last(sim_cluster: SimulatedCluster) -> None:
    namespace = f"t-{secrets.token_hex(4)}"
    with sim_cluster.api_client() as api:
        kube_client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
        _make(api, namespace, "mnist")
        deadline = time.monotonic() + 120
        core = kube_client.CoreV1Api(api)
        while not core.list_namespaced_pod(namespace).items:  # the JobSet made its Job, the Job its pod
            assert time.monotonic() < deadline, "the JobSet's pod never appeared"
            time.sleep(0.5)
        assert remove_trainjob(api, namespace, "mnist", garbage_collector=True, timeout=120) is True
        # The foreground deletion finished only after everything the TrainJob owned was gone.
        assert _exists(api, namespace, "mnist") == {"TrainJob": False, "JobSet": False, "ConfigMap": False}
        assert kube_client.BatchV1Api(api).list_namespaced_job(namespace).items == []
        assert [p.metadata.name for p in core.list_namespaced_pod(namespace).items] == []

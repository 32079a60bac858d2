"""The simulated cluster itself (``tjpipe.local.cluster``): scheduling, the pod lifecycle kwok plays, the
pod annotations a user sets, storage for JobSets' claims, garbage collection, and stopping without leftovers.

Plain Jobs and JobSets are enough here: what a TrainJob does on this cluster is tests/lifecycle's subject.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import BatchV1Api, CoreV1Api, CustomObjectsApi, StorageV1Api
from kubernetes.client.exceptions import ApiException

from tjpipe.local.cluster import (
    FAIL_ANNOTATION,
    GPU_RESOURCE,
    HOST_PATH_PROVISIONER,
    RUN_TIME_ANNOTATION,
    STORAGE_CLASS,
    SimulatedCluster,
)

pytestmark = [pytest.mark.cluster]


def _job(name: str, *, annotations: dict[str, str], pods: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "completions": pods,
            "parallelism": pods,
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "example.com/train:1",
                            "resources": {"limits": {GPU_RESOURCE: "1", "cpu": "1", "memory": "1Gi"}},
                        }
                    ],
                },
            },
        },
    }


def _finished(job: Any) -> str | None:
    for condition in job.status.conditions or []:
        if condition.type in ("Complete", "Failed") and condition.status == "True":
            return str(condition.type)
    return None


def _wait(predicate: Any, *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def test_pods_run_then_succeed_or_fail_as_annotated(sim_cluster: SimulatedCluster) -> None:
    namespace = f"sim-{secrets.token_hex(3)}"
    with sim_cluster.api_client() as api:
        core, batch = CoreV1Api(api), BatchV1Api(api)
        core.create_namespace({"metadata": {"name": namespace}})
        batch.create_namespaced_job(namespace, _job("passes", annotations={}))
        batch.create_namespaced_job(namespace, _job("fails", annotations={FAIL_ANNOTATION: "true"}))
        batch.create_namespaced_job(namespace, _job("long", annotations={RUN_TIME_ANNOTATION: "1h"}, pods=1))

        def settled() -> bool:
            jobs = {j.metadata.name: j for j in batch.list_namespaced_job(namespace).items}
            return _finished(jobs["passes"]) is not None and _finished(jobs["fails"]) is not None

        _wait(settled, timeout=60, what="the passing and the failing Job to finish")
        jobs = {j.metadata.name: j for j in batch.list_namespaced_job(namespace).items}
        assert _finished(jobs["passes"]) == "Complete" and jobs["passes"].status.succeeded == 2
        assert _finished(jobs["fails"]) == "Failed" and jobs["fails"].status.failed == 2
        assert _finished(jobs["long"]) is None and jobs["long"].status.active == 1

        pods = {
            p.metadata.labels["job-name"] + "/" + p.metadata.name: p for p in core.list_namespaced_pod(namespace).items
        }
        # The session cluster may have grown (ensure_nodes in other tests): every simulated node counts.
        nodes = {n.metadata.name for n in core.list_node().items if n.metadata.name.startswith("sim-node-")}
        assert len(pods) == 5 and {p.spec.node_name for p in pods.values()} <= nodes
        for key, pod in pods.items():
            (container,) = pod.status.container_statuses
            if key.startswith("passes/"):
                assert pod.status.phase == "Succeeded" and container.state.terminated.exit_code == 0
            elif key.startswith("fails/"):
                assert pod.status.phase == "Failed" and container.state.terminated.exit_code == 1
                assert container.state.terminated.message == f"failed on purpose ({FAIL_ANNOTATION})"
            else:
                assert pod.status.phase == "Running" and container.ready and pod.status.pod_ip

        # Deleting the Job: its running pod is killed (Failed) and the garbage collector removes them all.
        batch.delete_namespaced_job("long", namespace, propagation_policy="Background")
        batch.delete_namespaced_job("passes", namespace, propagation_policy="Background")
        left = {"long", "passes"}
        _wait(
            lambda: not [p for p in core.list_namespaced_pod(namespace).items if p.metadata.labels["job-name"] in left],
            timeout=60,
            what="the garbage collector to remove the deleted Jobs' pods",
        )
        # The namespace controller finishes deleting a namespace (nothing would on a bare apiserver).
        core.delete_namespace(namespace)
        _wait(
            lambda: namespace not in {n.metadata.name for n in core.list_namespace().items},
            timeout=90,
            what=f"namespace {namespace} to finish terminating",
        )


def _jobset_with_a_claim(name: str, *, retention: str | None) -> dict[str, Any]:
    """Two replicated jobs sharing one claimed volume, the second after the first completed: the shape of
    Trainer's torchtune runtimes (an initializer fills the volume, the trainer reads it)."""
    policy: dict[str, Any] = {
        "templates": [
            {
                "metadata": {"name": "workspace"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "20Gi"}}},
            }
        ]
    }
    if retention is not None:
        policy["retentionPolicy"] = {"whenDeleted": retention}

    def rjob(rjob_name: str, **extra: Any) -> dict[str, Any]:
        container = {
            "name": rjob_name,
            "image": "example.com/x:1",
            "volumeMounts": [{"name": "workspace", "mountPath": "/w"}],
        }
        pod = {"spec": {"restartPolicy": "Never", "containers": [container]}}
        return {"name": rjob_name, "template": {"spec": {"backoffLimit": 0, "template": pod}}, **extra}

    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name},
        "spec": {
            "volumeClaimPolicies": [policy],
            "replicatedJobs": [
                rjob("initializer"),
                rjob("trainer", dependsOn=[{"name": "initializer", "status": "Complete"}]),
            ],
        },
    }


def _jobset_condition(custom: CustomObjectsApi, namespace: str, name: str) -> str | None:
    jobset: Any = custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", name)
    for condition in (jobset.get("status") or {}).get("conditions") or []:
        if condition["type"] in ("Completed", "Failed") and condition["status"] == "True":
            return str(condition["type"])
    return None


def _gone(read: Any, *args: Any) -> bool:
    try:
        read(*args)
    except ApiException as error:
        if error.status == 404:
            return True
        raise
    return False


def test_a_jobsets_claims_are_provisioned_bound_and_cleaned_up_as_its_policy_says(
    sim_cluster: SimulatedCluster,
) -> None:
    namespace = f"sim-{secrets.token_hex(3)}"
    with sim_cluster.api_client() as api:
        core, custom = CoreV1Api(api), CustomObjectsApi(api)
        (default_class,) = [
            c
            for c in StorageV1Api(api).list_storage_class().items
            if (c.metadata.annotations or {}).get("storageclass.kubernetes.io/is-default-class") == "true"
        ]
        assert (default_class.metadata.name, default_class.provisioner) == (STORAGE_CLASS, HOST_PATH_PROVISIONER)
        core.create_namespace({"metadata": {"name": namespace}})
        for name, retention in (("deleted", None), ("kept", "Retain")):
            custom.create_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", _jobset_with_a_claim(name, retention=retention)
            )
        _wait(
            lambda: all(_jobset_condition(custom, namespace, n) for n in ("deleted", "kept")),
            timeout=90,
            what="both JobSets to finish",
        )
        assert {n: _jobset_condition(custom, namespace, n) for n in ("deleted", "kept")} == {
            "deleted": "Completed",
            "kept": "Completed",
        }
        # Each JobSet's claim (JobSet names it <template>-<JobSet>) got a volume of the default class.
        volumes = {}
        for name in ("deleted", "kept"):
            claim = core.read_namespaced_persistent_volume_claim(f"workspace-{name}", namespace)
            assert claim.status.phase == "Bound" and claim.spec.storage_class_name == STORAGE_CLASS
            volume = core.read_persistent_volume(claim.spec.volume_name)
            assert (
                volume.spec.capacity["storage"] == "20Gi" and volume.spec.persistent_volume_reclaim_policy == "Delete"
            )
            assert Path(volume.spec.host_path.path).is_dir()
            volumes[name] = volume
            owners = [(o.kind, o.name) for o in claim.metadata.owner_references or []]
            # JobSet's webhook defaults the retention to Delete, which makes the JobSet the claim's owner.
            assert owners == ([("JobSet", name)] if name == "deleted" else []), owners
        # Every pod mounted its JobSet's claim, ran on a simulated node and succeeded; the trainer after the
        # initializer had finished (dependsOn).
        pods = core.list_namespaced_pod(namespace).items
        assert len(pods) == 4
        for pod in pods:
            jobset = pod.metadata.labels["jobset.sigs.k8s.io/jobset-name"]
            claims = [v.persistent_volume_claim.claim_name for v in pod.spec.volumes if v.persistent_volume_claim]
            assert claims == [f"workspace-{jobset}"] and pod.status.phase == "Succeeded" and pod.spec.node_name

        for name in ("deleted", "kept"):
            custom.delete_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", name, propagation_policy="Background"
            )
        deleted = volumes["deleted"]
        _wait(
            lambda: (
                _gone(core.read_namespaced_persistent_volume_claim, "workspace-deleted", namespace)
                and _gone(core.read_persistent_volume, deleted.metadata.name)
            ),
            timeout=90,
            what="the deleted JobSet's claim and its volume to be removed",
        )
        assert not Path(deleted.spec.host_path.path).exists()
        _wait(lambda: not core.list_namespaced_pod(namespace).items, timeout=60, what="the JobSets' pods to go")
        kept = core.read_namespaced_persistent_volume_claim("workspace-kept", namespace)
        assert kept.status.phase == "Bound" and kept.metadata.deletion_timestamp is None
        core.delete_namespaced_persistent_volume_claim("workspace-kept", namespace)
        _wait(
            lambda: _gone(core.read_persistent_volume, volumes["kept"].metadata.name),
            timeout=60,
            what="the retained claim's volume to go with the claim",
        )


def test_more_nodes_on_a_running_cluster(sim_cluster: SimulatedCluster) -> None:
    names = sim_cluster.ensure_nodes(6)
    assert names == tuple(f"sim-node-{i}" for i in range(6))
    with sim_cluster.api_client() as api:
        node = CoreV1Api(api).read_node("sim-node-5")
    assert node.status.allocatable[GPU_RESOURCE] == "8"
    assert {c.type: c.status for c in node.status.conditions}["Ready"] == "True"


def test_every_process_listens_on_loopback_only(sim_cluster: SimulatedCluster) -> None:
    pids = {p.pid for p in (*sim_cluster.simulation.processes, sim_cluster.simulation.jobset.process)}
    sockets = _listening_socket_inodes()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                address = sockets.get(target[len("socket:[") : -1])
                assert address is None or address in ("0100007F", "00000000000000000000000001000000"), (pid, address)


def _listening_socket_inodes() -> dict[str, str]:
    """inode -> local address (hex, as /proc/net/tcp prints it) of every listening TCP socket."""
    listening: dict[str, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                listening[fields[9]] = fields[1].split(":")[0]
    return listening

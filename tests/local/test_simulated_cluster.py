"""The simulated cluster itself (``tjpipe.local.cluster``): scheduling, the pod lifecycle kwok plays, the
pod annotations a user sets, garbage collection, and stopping without leftovers.

Plain Jobs are enough here: what a TrainJob does on this cluster is tests/lifecycle's subject.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import BatchV1Api, CoreV1Api

from tjpipe.local.cluster import FAIL_ANNOTATION, GPU_RESOURCE, RUN_TIME_ANNOTATION, SimulatedCluster

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

"""Issue #12: 200 TrainJobs run to completion on 20 simulated nodes, and none is lost on the way.

All are created at once; each becomes a JobSet, a Job and a pod that kwok runs for a few seconds. The test
ends when every TrainJob has Trainer's Complete status (or fails at its bound), and then checks each one:
its whole status, its JobSet's Completed condition copied with its time, its pod Succeeded on a simulated
node, and no dead letter. Loopback only; the count and the wait are bounded.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from faults.support import Pipeline, WriteCounts, report, trainjob, until
from kubernetes import client as kube_client

from tjpipe.local.cluster import NODE_LABEL, SimulatedCluster

from .support import JOBSET_NAME_LABEL, dead_letters_of, ready
from .trainer_status import COMPLETE, copied_from_jobset, expected, job_status, status_shape

pytestmark = [pytest.mark.cluster, pytest.mark.nats, pytest.mark.timeout(900)]

COUNT = 200
NODES = 20
ALL_COMPLETE_WITHIN = 600.0


def _ready_nodes(api: kube_client.ApiClient) -> set[str]:
    listed: Any = kube_client.CoreV1Api(api).list_node(label_selector=f"{NODE_LABEL}=true")
    return {
        node.metadata.name
        for node in listed.items
        if not node.spec.taints and any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
    }


async def test_200_trainjobs_run_to_completion_on_20_nodes(lifecycle: Pipeline, sim_cluster: SimulatedCluster) -> None:
    p = lifecycle
    await ready(p)
    nodes = set(sim_cluster.ensure_nodes(NODES))  # the session's nodes and the rest, all Ready
    # ...and schedulable: kube-controller-manager lifts a new node's not-ready taint a moment later.
    await until(lambda: _ready_nodes(p.api) >= nodes, timeout=60, what=f"{NODES} nodes without taints")

    names = [f"many-{index:03d}" for index in range(COUNT)]
    before = p.writes()
    started = time.monotonic()
    for name in names:
        p.create(trainjob(name, num_nodes=1))
    want = expected(COMPLETE, jobs=[job_status("node", succeeded=1)])

    def complete() -> bool:
        trainjobs = p.trainjobs()
        done = [n for n in names if n in trainjobs and status_shape(trainjobs[n]) == want]
        if len(done) < COUNT:
            raise AssertionError(f"{len(done)}/{COUNT} Complete")
        return True

    await until(complete, timeout=ALL_COMPLETE_WITHIN, what=f"{COUNT} TrainJobs Complete", interval=2.0)
    elapsed = time.monotonic() - started

    trainjobs = p.trainjobs()
    jobsets = p.jobsets()
    assert sorted(trainjobs) == names
    assert sorted(jobsets) == names
    wrong = {n: copied_from_jobset(trainjobs[n], jobsets[n]) for n in names}
    assert {n: w for n, w in wrong.items() if w} == {}
    listed: Any = kube_client.CoreV1Api(p.api).list_namespaced_pod(p.namespace, label_selector=JOBSET_NAME_LABEL)
    pods = {pod.metadata.labels[JOBSET_NAME_LABEL]: pod for pod in listed.items}
    assert sorted(pods) == names
    assert {pod.status.phase for pod in pods.values()} == {"Succeeded"}
    placed = Counter(pod.spec.node_name for pod in pods.values())
    assert set(placed) <= nodes, placed
    assert await dead_letters_of(p) == []

    writes: WriteCounts = p.writes() - before
    report(
        "many",
        trainjobs=COUNT,
        nodes=NODES,
        nodes_used=len(placed),
        seconds_to_all_complete=round(elapsed, 1),
        status_writes_per_trainjob=round(writes.writes("trainjobs", "status") / COUNT, 2),
    )

"""What the benchmark creates and what it expects back: TrainJobs, runtimes, events, components. No I/O.

Three kinds of TrainJob are used:

* ``torch``: Trainer's ``torch-distributed``; components are the runtime snapshot ConfigMap and the JobSet;
* ``mpi``: ``deepspeed-distributed`` (OpenMPI, launcher runs as a node); adds the SSH Secret and the
  hostfile ConfigMap;
* ``gang``: a copy of ``torch-distributed`` with ``podGroupPolicy.coscheduling`` installed under another
  name; adds the scheduler-plugins PodGroup.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec

from contracts.messages import TrainJobObserved
from contracts.trainer import TrainingRuntime, TrainJob

Kind = Literal["torch", "mpi", "gang"]

TORCH_RUNTIME = "torch-distributed"
MPI_RUNTIME = "deepspeed-distributed"
GANG_RUNTIME = "bench-torch-coscheduling"
GANG_TIMEOUT_SECONDS = 60

RUNTIME_OF: Mapping[Kind, str] = {"torch": TORCH_RUNTIME, "mpi": MPI_RUNTIME, "gang": GANG_RUNTIME}
TORCH_ONLY: tuple[Kind, ...] = ("torch",)
MIX: tuple[Kind, ...] = ("torch", "mpi", "gang")

TRAINER_API = "trainer.kubeflow.org/v1alpha1"
TRAINER_NODE_JOBS = frozenset({"node", "launcher"})
"""Replicated jobs whose pods are training nodes (the MPI launcher runs as one with runLauncherAsNode)."""


def gang_runtime(torch_runtime: Mapping[str, Any], *, name: str = GANG_RUNTIME) -> dict[str, Any]:
    """``torch-distributed`` under another name, asking for gang scheduling with a 60 s timeout."""
    out = copy.deepcopy(dict(torch_runtime))
    labels = dict(out.get("metadata", {}).get("labels") or {})
    out["metadata"] = {"name": name, "labels": labels}
    out["spec"]["podGroupPolicy"] = {"coscheduling": {"scheduleTimeoutSeconds": GANG_TIMEOUT_SECONDS}}
    return out


def kinds_for(n: int, mix: Sequence[Kind]) -> list[Kind]:
    """``n`` kinds taken round robin from ``mix``, so each kind gets an equal share (±1)."""
    return [mix[i % len(mix)] for i in range(n)]


def mix_name(kinds: Sequence[Kind]) -> str:
    """``torch`` for a torch-only run, else ``mix``: which floor an end-to-end run is stated against."""
    return "torch" if set(kinds) <= {"torch"} else "mix"


def num_nodes_for(index: int) -> int:
    """2, 3 or 4 nodes, varied so a JobSet built from the wrong TrainJob would show."""
    return 2 + index % 3


def trainjob_body(
    namespace: str, name: str, kind: Kind, num_nodes: int, *, runtime_name: str | None = None
) -> dict[str, Any]:
    """A TrainJob shaped like Trainer's examples: a node count and per-node resources.

    ``runtime_name`` overrides the kind's runtime (the planner microbenchmark plans every shipped one).
    """
    return {
        "apiVersion": TRAINER_API,
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace, "labels": {"tjpipe-bench/kind": kind}},
        "spec": {
            "runtimeRef": {"name": runtime_name or RUNTIME_OF[kind]},
            "trainer": {
                "numNodes": num_nodes,
                "resourcesPerNode": {
                    "requests": {"cpu": "2", "memory": "4Gi"},
                    "limits": {"cpu": "2", "memory": "4Gi"},
                },
            },
        },
    }


def required_components(kind: Kind, name: str) -> frozenset[str]:
    """The ``ApplyResult.component`` names that must succeed before the TrainJob counts as built."""
    base = {f"configmap.{name}-runtime-snapshot", "jobset"}
    if kind == "mpi":
        base |= {f"secret.{name}-mpi-ssh-auth", f"configmap.{name}-mpi-hostfile"}
    if kind == "gang":
        base.add("podgroup")
    return frozenset(base)


def jobset_nodes(replicated_jobs: Sequence[tuple[str, int | None, int | None]]) -> int:
    """Training nodes in a JobSet from its (name, replicas, parallelism) triples: node and launcher pods."""
    total = 0
    for name, replicas, parallelism in replicated_jobs:
        if name in TRAINER_NODE_JOBS:
            total += (1 if replicas is None else replicas) * (1 if parallelism is None else parallelism)
    return total


def observed_event(
    *,
    namespace: str,
    name: str,
    uid: str,
    kind: Kind,
    runtime: Mapping[str, Any],
    num_nodes: int,
    observed_at: float,
    resource_version: str = "1",
) -> TrainJobObserved:
    """The event the watcher publishes for a new TrainJob: live runtime, no JobSet, no snapshot yet."""
    runtime_name = str(runtime.get("metadata", {}).get("name") or RUNTIME_OF[kind])
    body = trainjob_body(namespace, name, kind, num_nodes, runtime_name=runtime_name)
    body["metadata"].update({"uid": uid, "resourceVersion": resource_version, "generation": 1})
    rt = copy.deepcopy(dict(runtime))
    rt.setdefault("metadata", {}).setdefault("resourceVersion", "1")
    return TrainJobObserved(
        trainjob=msgspec.convert(body, TrainJob),
        runtime=msgspec.convert(rt, TrainingRuntime),
        runtime_source="live",
        priority_classes=(),
        observed_at=observed_at,
        cause="TrainJob ADDED",
        trace_id="0" * 32,
    )

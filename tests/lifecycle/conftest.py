"""The pipeline on the simulated cluster: real controllers make Jobs, Pods, status and garbage collection.

``sim_cluster`` (tests/conftest.py) is the session's simulated cluster: its own kube-apiserver with
kube-controller-manager, kube-scheduler, JobSet v0.12.0's manager with its webhooks (``failurePolicy:
Fail``) and kwok nodes whose pods run a few seconds. Each test module here gets the fault harness's
pipeline on it (``faults.support.open_pipeline``: its own nats-server, the three services, the watcher
limited to one fresh namespace, the API server's write counters), started once for the module.

``reconciler`` runs a module's tests twice: with the pipeline, and with Kubeflow Trainer v2.3.0's own
controller manager (built from its Go module, ``tjpipe.local.trainer_controller``) on a simulated cluster
of its own, since Trainer reconciles every TrainJob in a cluster and registers its webhooks cluster-wide.
The same assertions hold for both, so the expected statuses are Trainer's, not only our reading of its code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from faults.support import Pipeline, close_pipeline, open_pipeline

from tjpipe.local.cluster import start_simulated_cluster
from tjpipe.local.trainer_controller import TrainerController

from .support import Reconciler

RUNTIMES = ("torch-distributed", "deepspeed-distributed", "torchtune-llama3.2-1b")
POD_RUN_SECONDS = 3.0


@pytest.fixture(scope="module")
def lifecycle(sim_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    pipe = open_pipeline(sim_cluster.kube, tmp_path_factory.mktemp("lifecycle"), runtimes=RUNTIMES)
    try:
        pipe.start_all()
        yield pipe
    finally:
        print(close_pipeline(pipe))


@pytest.fixture(scope="module")
def trainer_reference(
    tmp_path_factory: pytest.TempPathFactory, uncaptured_progress: Callable[[str], None]
) -> Iterator[Pipeline]:
    """Trainer's controller on a simulated cluster of its own; the fault harness's ``Pipeline`` (its services
    never started) for reads and writes in a fresh namespace."""
    root = tmp_path_factory.mktemp("trainer-reference")
    cluster = start_simulated_cluster(
        work_dir=root / "cluster",
        log_dir=root / "logs",
        kubeconfig_path=root / "kubeconfig",
        progress=uncaptured_progress,
        pod_run_seconds=POD_RUN_SECONDS,
    )
    controller: TrainerController | None = None
    pipe: Pipeline | None = None
    try:
        pipe = open_pipeline(cluster.kube, root / "harness", runtimes=RUNTIMES)
        controller = TrainerController(
            kubeconfig=cluster.kubeconfig, state_dir=root / "trainer", progress=uncaptured_progress
        ).start()
        if controller.process is not None:
            pipe.processes["trainer-controller"] = controller.process  # its log tail on failure
        yield pipe
    finally:
        if pipe is not None:
            print(close_pipeline(pipe))
        if controller is not None:
            controller.stop()
        cluster.stop()


@pytest.fixture(scope="module", params=["pipeline", "trainer-v2.3.0"])
def reconciler(request: pytest.FixtureRequest) -> Reconciler:
    if request.param == "pipeline":
        return Reconciler(p=request.getfixturevalue("lifecycle"), trainer=False)
    return Reconciler(p=request.getfixturevalue("trainer_reference"), trainer=True)
